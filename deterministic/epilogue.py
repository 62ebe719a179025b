"""Epilogues: the elementwise consumer of a matrix product, applied as each output is stored.

A product whose only consumer is elementwise need not be written out and read back: the matmul
kernels (:mod:`.matmul` on the CPU, :mod:`.cuda`'s on the GPU) apply :func:`apply_row` to
the stored products, still in cache, and it writes what the consumer would have computed:

* :data:`PLAIN`: ``out = p`` (the product alone);
* :data:`ADD`: ``out = fadd(extra, p)``, for ``add(extra, matmul(…))`` (a residual add);
* :data:`GELU`: ``out = p`` and ``out2 = gelu(p)``, for ``matmul(…)`` then ``gelu`` of it;
* :data:`GELU_BACKWARD`: ``out = gelu_backward(extra, p)``, for ``gelu_backward(u, matmul(…))``.

Why the bits are the unfused ones: ``p`` is the product's element after its whole fixed-order
sum (the chunk folds and the tree are finished before anything is stored), and the epilogue is
the very device function the separate elementwise kernel applies to that element, with the same
operands in the same order. Fusion removes a pass over memory, never an operation or a rounding,
so a fused step equals the unfused one bit for bit (the tests compare whole states); it is not an
engine version change. What it does remove are the intermediates (the product before the add or
the GELU's backward), which docs/run-format.md §11's op trace names: a trace producer runs the
unfused path (``fused=False`` on a backend).
"""

from __future__ import annotations

import numpy as np

from .activation import gelu, gelu_backward, gelu_backward_reference, gelu_reference
from .jit import device
from .primitives import fadd

PLAIN = 0
ADD = 1
GELU = 2
GELU_BACKWARD = 3
EPILOGUES = (PLAIN, ADD, GELU, GELU_BACKWARD)


@device
def apply_row(kind, extra, out, out2):
    """Epilogue ``kind`` over one run of outputs whose products are already stored in ``out``
    (1-D, equal lengths; ``extra`` read and ``out2`` written only by the epilogues that name them):
    ``out = fadd(extra, out)``, ``out2 = gelu(out)`` or ``out = gelu_backward(extra, out)``.
    Plain elementwise loops over contiguous rows, so the CPU kernel's whole rows vectorise."""
    if kind == ADD:
        for j in range(out.shape[0]):
            out[j] = fadd(extra[j], out[j])
    elif kind == GELU:
        for j in range(out.shape[0]):
            out2[j] = gelu(out[j])
    elif kind == GELU_BACKWARD:
        for j in range(out.shape[0]):
            out[j] = gelu_backward(extra[j], out[j])


def epilogue_reference(kind: int, product: np.ndarray, extra: np.ndarray | None = None) -> tuple:
    """The unfused composition, in numpy float32: what :func:`apply_row` must equal, as ``(out,)`` or
    ``(out, out2)`` for :data:`GELU`."""
    if kind == ADD:
        with np.errstate(over="ignore", invalid="ignore"):
            return (extra + product,)
    if kind == GELU:
        return product, gelu_reference(product)
    if kind == GELU_BACKWARD:
        return (gelu_backward_reference(extra, product),)
    return (product,)
