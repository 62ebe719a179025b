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

from dataclasses import replace
from typing import Callable

from . import activation, attention, embedding, epilogue, loss, matmul, norm, optimizer, reduction
from .microbatch import MicroBatch, micro_batches, pack_batch
from .probes import probe_cpu
from .reduction import fixed_sum, pairwise_tree
from .state import TrainState
from .witness import StepScalars, witness_async


def read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


class CpuBackend:
    """Every op of the model and optimiser on the CPU; ``parallel`` selects the prange kernels.
    ``fused``: :mod:`.gpt` applies a product's elementwise consumer in the matmul's epilogue
    (:mod:`.epilogue`: the same bits, one pass fewer) instead of as a separate op."""

    def __init__(self, parallel: bool, fused: bool = True) -> None:
        self.parallel, self.fused = parallel, fused
        self.name = "cpu-parallel" if parallel else "cpu-serial"
        self._matmul_fused = matmul.MATMUL_FUSED[parallel]
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

    def _fused(self, a, b, trans_a, trans_b, kind, extra=None):
        three = a.ndim == 3
        a3, b3 = (a, b) if three else (a[None], b[None])
        e3 = matmul.NO_EXTRA if extra is None else (extra if three else extra[None])
        out, out2 = self._matmul_fused(a3, b3, trans_a, trans_b, matmul.DENSE, kind, e3)
        return (out, out2) if three else (out[0], out2[0] if kind == epilogue.GELU else out2)

    def matmul_add(self, x, a, b, trans_a: bool = False, trans_b: bool = False):
        """``add(x, matmul(a, b, …))`` in one pass (:data:`.epilogue.ADD`)."""
        return self._fused(a, b, trans_a, trans_b, epilogue.ADD, x)[0]

    def matmul_gelu(self, a, b, trans_a: bool = False, trans_b: bool = False):
        """``(u, gelu(u))`` of ``u = matmul(a, b, …)`` in one pass (:data:`.epilogue.GELU`)."""
        return self._fused(a, b, trans_a, trans_b, epilogue.GELU)

    def matmul_gelu_backward(self, u, a, b, trans_a: bool = False, trans_b: bool = False):
        """``gelu_backward(u, matmul(a, b, …))`` in one pass (:data:`.epilogue.GELU_BACKWARD`)."""
        return self._fused(a, b, trans_a, trans_b, epilogue.GELU_BACKWARD, u)[0]

    def sumsq(self, x: np.ndarray) -> np.float32:
        """``Σ fmul(x, x)`` over the flat array in the fixed order."""
        return pairwise_tree(self._chunk_sums(x.reshape(-1), True))

    def loss_and_grad(self, logits: np.ndarray, targets: np.ndarray, inv_n: np.float32):
        """``(mean loss share as a (1,) array, dlogits)`` (see :mod:`.loss`)."""
        loss_share, dlogits = self._cross_entropy(logits, targets, inv_n)
        return np.array([loss_share], np.float32), dlogits  # numba returns a float32 scalar as a Python float

    def cross_entropy(self, logits: np.ndarray, targets: np.ndarray, inv_n: np.float32):
        """``(mean loss share, dlogits)`` (see :mod:`.loss`)."""
        loss_share, dlogits = self.loss_and_grad(logits, targets, inv_n)
        return np.float32(loss_share[0]), dlogits

    def scatter_add(self, dwte: np.ndarray, dx: np.ndarray, tokens: np.ndarray) -> None:
        """``dwte[tokens[p]] += dx[p]`` in ascending p, in place."""
        self.scatter_add_sorted(dwte, dx, *embedding.positions_by_token(tokens, dwte.shape[0]))

    def scatter_add_sorted(self, dwte, dx, order, starts) -> None:
        """:meth:`scatter_add` given the tokens' counting sort (:func:`.embedding.positions_by_token`)."""
        self._scatter_add(dwte, dx, order, starts)

    def adamw(self, p, g, m, v, scalars: optimizer.AdamWScalars):
        return self._adamw(p, g, m, v, *scalars.args())

    # ---- whole-step pieces (the CUDA backend keeps them on the device) -----------------

    def micro_batches(self, batch: np.ndarray, vocab_size: int) -> list[list[MicroBatch]]:
        """Every micro-batch of a step's ``batch``, ready for :func:`.gpt.forward_backward`."""
        return micro_batches(*pack_batch(batch, vocab_size))

    def load_state(self, state: TrainState) -> tuple[dict, dict, dict]:
        """The state's parameters and moments as backend arrays."""
        return state.params, state.m, state.v

    def clip_norm(self, grads: list, max_norm: np.float32) -> np.ndarray:
        """``[global gradient norm, clipping coefficient]`` (:mod:`.optimizer`): each tensor's
        sum of squares, then their sum, in the fixed orders."""
        return self.clip(np.array([self.sumsq(g) for g in grads], np.float32), max_norm)

    def clip(self, sums: np.ndarray, max_norm: np.float32) -> np.ndarray:
        """``[norm, coefficient]`` from the gradients' sums of squares in parameter order."""
        norm = np.sqrt(fixed_sum(sums))
        return np.array([norm, optimizer.clip_coefficient(norm, max_norm)], np.float32)

    def start_witness(self, loss, grads: dict, order: list[str], clip, rule: str) -> Callable[[], StepScalars]:
        """Start hashing the replay witness of (``loss``, ``grads``) by ``rule`` in the background;
        the returned function gives the step's :class:`.witness.StepScalars` (on a device backend
        it waits for them, so call it after launching the update)."""
        done = witness_async(np.float32(loss[0]), grads, order, np.float32(clip[0]), np.float32(clip[1]), rule)
        return lambda: done

    def adamw_all(self, params: dict, grads: dict, m: dict, v: dict, scalars: dict, clip):
        """AdamW of every parameter with coefficient ``clip[1]``; the result is for :meth:`to_state`."""
        out = {name: self.adamw(params[name], grads[name], m[name], v[name], replace(scalars[name], coef=clip[1]))
               for name in params}  # fmt: skip
        return tuple({name: read_only(arrays[i]) for name, arrays in out.items()} for i in range(3))

    def to_state(self, config, updated, step: int, beta1_pow, beta2_pow) -> TrainState:
        """The :class:`TrainState` of :meth:`adamw_all`'s result."""
        return TrainState(config, *updated, step, beta1_pow, beta2_pow)

    def probe(self, x: np.ndarray) -> np.ndarray:
        """:func:`.probes.probe_row` on this target (host array in and out)."""
        return probe_cpu(x)


PARALLEL_MIN_PARAMS = 1_000_000
"""Models from this size up run on the parallel CPU kernels by default; below it, starting
threads costs more than it saves (the tiny preset's step takes ~10 ms serially). Speed only."""

_CPU: dict[tuple[bool, bool], CpuBackend] = {}


def cpu_backend(parallel: bool, fused: bool = True) -> CpuBackend:
    """The process-wide CPU backend (its kernels compile, or load from the cache, on first use)."""
    if (parallel, fused) not in _CPU:
        _CPU[parallel, fused] = CpuBackend(parallel, fused)
    return _CPU[parallel, fused]


def default_backend(config) -> CpuBackend:
    """The CPU backend a step of ``config``'s model uses when none is given."""
    return cpu_backend(config.n_params() >= PARALLEL_MIN_PARAMS)
