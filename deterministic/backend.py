"""The kernels bound to a target, behind one interface the model code is written against.

:class:`CpuBackend` runs the numba CPU kernels, serial or parallel (``prange`` over independent
outputs only, so both give the same bits); :class:`.cuda.CudaBackend` has the same methods over
device arrays. :mod:`.gpt` and :mod:`.step` call nothing else, so a step is the same sequence
of kernels on every target.

Arrays are float32 (int32 for tokens), C-contiguous. ``matmul`` takes 2-D or 3-D (batched)
operands.
"""

from __future__ import annotations

import numpy as np

from . import activation, attention, embedding, loss, matmul, norm, optimizer, reduction
from .probes import probe_cpu
from .reduction import pairwise_tree


class CpuBackend:
    """Every op of the model and optimiser on the CPU; ``parallel`` selects the prange kernels."""

    def __init__(self, parallel: bool) -> None:
        self.parallel = parallel
        self.name = "cpu-parallel" if parallel else "cpu-serial"
        self._matmul = matmul.MATMUL[parallel]
        self.sum_rows, self._chunk_sums, self.add, self.plus_zero = reduction.KERNELS[parallel]
        self.rmsnorm, self.rmsnorm_backward = norm.KERNELS[parallel]
        self.gelu, self.gelu_backward = activation.KERNELS[parallel]
        (self.split_heads, self.merge_heads, self.merge_qkv,
         self.causal_softmax, self.causal_softmax_backward) = attention.KERNELS[parallel]  # fmt: skip
        self._cross_entropy = loss.KERNELS[parallel]
        self.embed, self._scatter_add = embedding.KERNELS[parallel]
        self._adamw = optimizer.KERNELS[parallel]

    # Host <-> backend arrays (identity on the CPU).
    def upload(self, a: np.ndarray) -> np.ndarray:
        return a

    def download(self, a: np.ndarray) -> np.ndarray:
        return a

    def zeros(self, shape: tuple[int, ...]) -> np.ndarray:
        return np.zeros(shape, np.float32)

    def matmul(self, a: np.ndarray, b: np.ndarray, trans_a: bool = False, trans_b: bool = False,
               structure: int = matmul.DENSE) -> np.ndarray:
        """``op(a) @ op(b)``; ``structure`` (:data:`.matmul.CAUSAL_OUTPUT` …) names zeros the kernel may use."""
        if a.ndim == 3:
            return self._matmul(a, b, trans_a, trans_b, structure)
        return self._matmul(a[None], b[None], trans_a, trans_b, structure)[0]

    def sumsq(self, x: np.ndarray) -> np.float32:
        """``Σ fmul(x, x)`` over the flat array in the fixed order."""
        return pairwise_tree(self._chunk_sums(x.reshape(-1), True))

    def cross_entropy(self, logits: np.ndarray, targets: np.ndarray, inv_n: np.float32):
        """``(mean loss share, dlogits)`` (see :mod:`.loss`)."""
        loss_share, dlogits = self._cross_entropy(logits, targets, inv_n)
        return np.float32(loss_share), dlogits  # numba returns a float32 scalar as a Python float

    def scatter_add(self, dwte: np.ndarray, dx: np.ndarray, tokens: np.ndarray) -> None:
        """``dwte[tokens[p]] += dx[p]`` in ascending p, in place."""
        order, starts = embedding.positions_by_token(tokens, dwte.shape[0])
        self._scatter_add(dwte, dx, order, starts)

    def adamw(self, p, g, m, v, scalars: optimizer.AdamWScalars):
        return self._adamw(p, g, m, v, *scalars.args())

    def probe(self, x: np.ndarray) -> np.ndarray:
        """:func:`.probes.probe_row` on this target (host array in and out)."""
        return probe_cpu(x)


PARALLEL_MIN_PARAMS = 1_000_000
"""Models from this size up run on the parallel CPU kernels by default; below it, starting
threads costs more than it saves (the tiny preset's step takes ~10 ms serially). Speed only."""

_CPU: dict[bool, CpuBackend] = {}


def cpu_backend(parallel: bool) -> CpuBackend:
    """The process-wide CPU backend (its kernels compile, or load from the cache, on first use)."""
    if parallel not in _CPU:
        _CPU[parallel] = CpuBackend(parallel)
    return _CPU[parallel]


def default_backend(config) -> CpuBackend:
    """The CPU backend a step of ``config``'s model uses when none is given."""
    return cpu_backend(config.n_params() >= PARALLEL_MIN_PARAMS)
