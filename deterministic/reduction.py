"""The one summation order every reduction in the model uses.

A sum of n float32 terms is computed as:

1. split the terms into consecutive chunks of ``K_CHUNK`` (the last may be shorter);
2. fold each chunk left to right from ``0.0``: ``s = s + term`` (for a dot product,
   ``s = s + a[k] * b[k]`` with the product rounded first, never fused);
3. combine the chunk sums with a pairwise tree, level by level: ``(p0+p1), (p2+p3), ...``;
   an odd last element is carried up unchanged to the next level.

The order depends only on n — never on threads, SIMD width or the device — so the result
is a pure function of the input bits. An empty sum is ``+0.0``.

``fixed_sum_reference``/``fixed_dot_reference`` are the slow, obvious numpy float32 versions
used by tests to check the compiled kernels bit for bit.
"""

from __future__ import annotations

import numpy as np
from numba import njit

K_CHUNK = 32
"""Length of the sequential fold before partial sums go into the pairwise tree."""

_ZERO = np.float32(0.0)


def n_chunks(n: int) -> int:
    """How many partial sums a reduction over n terms produces (at least 1)."""
    return max(1, (n + K_CHUNK - 1) // K_CHUNK)


@njit(cache=True, error_model="numpy", nogil=True)
def tree_reduce(partials, n):
    """Pairwise tree over ``partials[:n]`` (overwritten); odd last element carried up."""
    if n == 0:
        return _ZERO
    while n > 1:
        half = n // 2
        for i in range(half):
            partials[i] = partials[2 * i] + partials[2 * i + 1]
        if n % 2 == 1:
            partials[half] = partials[n - 1]
            n = half + 1
        else:
            n = half
    return partials[0]


@njit(cache=True, error_model="numpy", nogil=True)
def fixed_dot(a, b, partials):
    """Sum of ``a[k] * b[k]`` for 1-D float32 ``a``, ``b`` in the fixed order.

    ``partials`` is scratch of at least ``n_chunks(len(a))`` float32 entries, allocated once
    by the caller so inner loops do not allocate.
    """
    n = a.shape[0]
    nc = 0
    for start in range(0, n, K_CHUNK):
        stop = min(start + K_CHUNK, n)
        s = _ZERO
        for k in range(start, stop):
            s = s + a[k] * b[k]
        partials[nc] = s
        nc += 1
    return tree_reduce(partials, nc)


@njit(cache=True, error_model="numpy", nogil=True)
def fixed_sum(a, partials):
    """Sum of 1-D float32 ``a`` in the fixed order (see module doc)."""
    n = a.shape[0]
    nc = 0
    for start in range(0, n, K_CHUNK):
        stop = min(start + K_CHUNK, n)
        s = _ZERO
        for k in range(start, stop):
            s = s + a[k]
        partials[nc] = s
        nc += 1
    return tree_reduce(partials, nc)


def fixed_sum_reference(terms: np.ndarray) -> np.ndarray:
    """Reference: sums over axis 0 of float32 ``terms`` (shape (n, ...)), same order.

    Vectorised over the trailing axes only; every output element sees exactly the
    operations of :func:`fixed_sum`.
    """
    terms = np.asarray(terms, dtype=np.float32)
    n = terms.shape[0]
    partials = []
    for start in range(0, n, K_CHUNK):
        s = np.zeros(terms.shape[1:], np.float32)
        for k in range(start, min(start + K_CHUNK, n)):
            s = s + terms[k]
        partials.append(s)
    if not partials:
        return np.zeros(terms.shape[1:], np.float32)
    while len(partials) > 1:
        level = [partials[i] + partials[i + 1] for i in range(0, len(partials) - 1, 2)]
        if len(partials) % 2 == 1:
            level.append(partials[-1])
        partials = level
    return partials[0]
