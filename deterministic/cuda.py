"""The same kernels compiled with numba-cuda, and :class:`CudaBackend` over device arrays.

Importing this module binds the primitives to CUDA — ``fadd``/``fsub``/``fmul``/``fdiv``/
``fsqrt``/``ffma`` become the NVVM intrinsics ``add.rn``/``mul.rn``/``div.rn``/``sqrt.rn``/
``fma.rn``, which NVVM and ptxas never contract or split and which keep subnormals — and registers every
:func:`.jit.device` function for the CUDA target. The row and element bodies (``rmsnorm_forward_row``,
``expf``, ``adamw_element``, …) are then the very functions the CPU kernels inline; only the
drivers below (which thread does which row) are CUDA-specific.

Schedules: one thread per output row or element; the matmul gives each thread one output and
stages 16-row/16-column tiles of A and B in shared memory one ``K_CHUNK`` at a time, so a
thread's chunk fold and streaming tree are exactly those of :mod:`.reduction`. Block and grid
sizes decide only *which* thread computes an output, never the order of its sum.

Under the CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``, process-wide) the kernels run as Python
on the CPU and the bodies run as their numpy emulation; the tests use it at tiny sizes to check
the drivers' logic bit for bit against the CPU backend.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32
from numba.cuda.core import config as cuda_config

from . import primitives
from .activation import gelu, gelu_backward
from .attention import causal_softmax_backward_row, causal_softmax_row, merge_heads_row, split_heads_row
from .embedding import embed_row, positions_by_token, scatter_add_row
from .jit import DEVICE_FUNCTIONS
from .loss import cross_entropy_row
from .matmul import CAUSAL_OUTPUT, DENSE
from .norm import rmsnorm_backward_row, rmsnorm_forward_row
from .optimizer import AdamWScalars, adamw_element
from .primitives import fadd, ffma
from .probes import PROBE_OUTPUTS, probe_row
from .reduction import (
    K_CHUNK, STACK_DEPTH, ZERO, chunk_sum, column_sum, fixed_sum, pairwise_tree, stack_push, stack_total,
)  # fmt: skip

SIMULATED = bool(cuda_config.ENABLE_CUDASIM)

# Schedules only, no effect on results. The simulator runs every thread as a Python thread, so
# it gets small blocks (which also shows that the block shape does not change any bit).
TILE = 8 if SIMULATED else 16
"""Outputs per block edge of the matmul; divides ``K_CHUNK``."""
THREADS = 32 if SIMULATED else 128
"""Threads per block of the row and element kernels."""


def _bind_primitives() -> None:
    from llvmlite import ir
    from numba.core import types
    from numba.cuda.extending import intrinsic, overload

    f32 = types.float32
    fty = ir.FloatType()

    def negate(builder, x):
        # x with its sign bit flipped: exact, and no float instruction (NVVM's IR has no fneg)
        bits = builder.bitcast(x, ir.IntType(32))
        return builder.bitcast(builder.xor(bits, ir.Constant(ir.IntType(32), 0x80000000)), fty)

    def nvvm(builder, name, args):
        fnty = ir.FunctionType(fty, [fty] * len(args))
        fn = builder.module.globals.get(name) or ir.Function(builder.module, fnty, name)
        return builder.call(fn, args)

    emitters = {
        primitives.fadd: lambda b, x, y: nvvm(b, "llvm.nvvm.add.rn.f", [x, y]),
        primitives.fsub: lambda b, x, y: nvvm(b, "llvm.nvvm.add.rn.f", [x, negate(b, y)]),
        primitives.fmul: lambda b, x, y: nvvm(b, "llvm.nvvm.mul.rn.f", [x, y]),
        primitives.fdiv: lambda b, x, y: nvvm(b, "llvm.nvvm.div.rn.f", [x, y]),
    }

    def bind_binary(fn, emit):
        @intrinsic
        def op(typingctx, a, b):
            if a != f32 or b != f32:
                return None
            return f32(f32, f32), lambda context, builder, sig, args: emit(builder, *args)

        overload(fn, target="cuda")(lambda a, b: lambda a, b: op(a, b))

    for fn, emit in emitters.items():
        bind_binary(fn, emit)

    @intrinsic
    def sqrt_rn(typingctx, a):
        if a != f32:
            return None
        return f32(f32), lambda context, builder, sig, args: nvvm(builder, "llvm.nvvm.sqrt.rn.f", list(args))

    @intrinsic
    def as_int32(typingctx, x):
        if x != f32:
            return None
        return types.int32(f32), lambda context, builder, sig, args: builder.bitcast(args[0], ir.IntType(32))

    @intrinsic
    def as_float32(typingctx, i):
        if not isinstance(i, types.Integer):
            return None
        return f32(i), lambda context, builder, sig, args: primitives.emit_int_to_f32_bits(
            builder, args[0], sig.args[0].bitwidth)

    @intrinsic
    def fma_rn(typingctx, a, b, c):
        if a != f32 or b != f32 or c != f32:
            return None
        return f32(f32, f32, f32), lambda context, builder, sig, args: nvvm(builder, "llvm.nvvm.fma.rn.f", list(args))

    overload(primitives.fsqrt, target="cuda")(lambda a: lambda a: sqrt_rn(a))
    overload(primitives.ffma, target="cuda")(lambda a, b, c: lambda a, b, c: fma_rn(a, b, c))
    overload(primitives.as_int32, target="cuda")(lambda x: lambda x: as_int32(x))
    overload(primitives.as_float32, target="cuda")(lambda i: lambda i: as_float32(i))
    for fn in DEVICE_FUNCTIONS:
        overload(fn, target="cuda", strict=False)(lambda *args, _fn=fn: _fn)


if not SIMULATED:
    _bind_primitives()


# ---- kernels: which thread computes what ------------------------------------------------------


@cuda.jit
def matmul_kernel(a, b, out, trans_a, trans_b, structure):
    m, n = out.shape[1], out.shape[2]
    k = a.shape[1] if trans_a else a.shape[2]
    bi = cuda.blockIdx.z
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    i0, j0 = cuda.blockIdx.y * TILE, cuda.blockIdx.x * TILE
    a_tile = cuda.shared.array((TILE, K_CHUNK), float32)
    b_tile = cuda.shared.array((K_CHUNK, TILE), float32)
    stack = cuda.local.array(STACK_DEPTH, float32)
    count = 0
    for k0 in range(0, k, K_CHUNK):
        for half in range(K_CHUNK // TILE):  # each thread stages K_CHUNK // TILE elements of each tile
            ka, kb = k0 + tx + half * TILE, k0 + ty + half * TILE
            a_tile[ty, tx + half * TILE] = ZERO
            if i0 + ty < m and ka < k:
                a_tile[ty, tx + half * TILE] = a[bi, ka, i0 + ty] if trans_a else a[bi, i0 + ty, ka]
            b_tile[ty + half * TILE, tx] = ZERO
            if j0 + tx < n and kb < k:
                b_tile[ty + half * TILE, tx] = b[bi, j0 + tx, kb] if trans_b else b[bi, kb, j0 + tx]
        cuda.syncthreads()
        s = ZERO
        for kk in range(min(K_CHUNK, k - k0)):
            s = ffma(a_tile[ty, kk], b_tile[kk, tx], s)
        count = stack_push(stack, count, s)
        cuda.syncthreads()
    if i0 + ty < m and j0 + tx < n:
        above = structure == CAUSAL_OUTPUT and j0 + tx > i0 + ty
        out[bi, i0 + ty, j0 + tx] = ZERO if above else stack_total(stack, count)


@cuda.jit
def embed_kernel(wte, wpe, tokens, x):
    r = cuda.grid(1)
    if r < x.shape[0]:
        embed_row(wte, wpe, tokens, x, r)


@cuda.jit
def scatter_add_kernel(dwte, dx, order, starts):
    token = cuda.grid(1)
    if token < dwte.shape[0]:
        scatter_add_row(dwte, dx, order, starts, token)


@cuda.jit
def rmsnorm_kernel(x, g, eps, inv_d, y, rstd):
    r = cuda.grid(1)
    if r < x.shape[0]:
        rmsnorm_forward_row(x, g, eps, inv_d, y, rstd, r, cuda.local.array(STACK_DEPTH, float32))


@cuda.jit
def rmsnorm_backward_kernel(x, g, rstd, dy, dres, inv_d, dx, dg_terms):
    r = cuda.grid(1)
    if r < x.shape[0]:
        rmsnorm_backward_row(x, g, rstd, dy, dres, inv_d, dx, dg_terms, r, cuda.local.array(STACK_DEPTH, float32))


@cuda.jit
def sum_rows_kernel(x, out):
    c = cuda.grid(1)
    if c < x.shape[1]:
        out[c] = column_sum(x, c, cuda.local.array(STACK_DEPTH, float32))


@cuda.jit
def chunk_sums_kernel(x, square, out):
    chunk = cuda.grid(1)
    if chunk < out.shape[0]:
        out[chunk] = chunk_sum(x, chunk, square)


@cuda.jit
def add_kernel(a, b, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = fadd(a[i], b[i])


@cuda.jit
def plus_zero_kernel(a, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = fadd(ZERO, a[i])


@cuda.jit
def gelu_kernel(u, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = gelu(u[i])


@cuda.jit
def gelu_backward_kernel(u, dy, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = gelu_backward(u[i], dy[i])


@cuda.jit
def split_heads_kernel(x, out, col0, seq_len, n_heads):
    row = cuda.grid(1)
    if row < x.shape[0]:
        split_heads_row(x, out, col0, row, seq_len, n_heads)


@cuda.jit
def merge_heads_kernel(o, out, col0, seq_len, n_heads):
    row = cuda.grid(1)
    if row < out.shape[0]:
        merge_heads_row(o, out, col0, row, seq_len, n_heads)


@cuda.jit
def softmax_kernel(s, scale, p):
    task = cuda.grid(1)
    if task < s.shape[0] * s.shape[1]:
        causal_softmax_row(s, scale, p, task // s.shape[1], task % s.shape[1], cuda.local.array(STACK_DEPTH, float32))


@cuda.jit
def softmax_backward_kernel(p, dp, scale, ds):
    task = cuda.grid(1)
    if task < p.shape[0] * p.shape[1]:
        causal_softmax_backward_row(p, dp, scale, ds, task // p.shape[1], task % p.shape[1],
                                    cuda.local.array(STACK_DEPTH, float32))  # fmt: skip


@cuda.jit
def cross_entropy_kernel(logits, targets, inv_n, dlogits, row_loss):
    r = cuda.grid(1)
    if r < logits.shape[0]:
        cross_entropy_row(logits, targets, inv_n, dlogits, row_loss, r, cuda.local.array(STACK_DEPTH, float32))


@cuda.jit
def adamw_kernel(p, g, m, v, p_out, m_out, v_out, b1, omb1, b2, omb2, decay, step_size, sqrt_bias2, eps, coef):
    i = cuda.grid(1)
    if i < p.shape[0]:
        adamw_element(p, g, m, v, p_out, m_out, v_out, i, b1, omb1, b2, omb2, decay, step_size, sqrt_bias2, eps, coef)


@cuda.jit
def probe_kernel(x, out):
    if cuda.grid(1) == 0:
        probe_row(x, out)


# ---- the backend ------------------------------------------------------------------------------


def _blocks(n: int) -> int:
    return max(1, (n + THREADS - 1) // THREADS)


class CudaBackend:
    """:class:`.backend.CpuBackend`'s interface over numba-cuda device arrays (see there)."""

    name = "cuda-simulator" if SIMULATED else "cuda"

    def __init__(self, device: int = 0) -> None:
        # numba keeps the current context per thread: this backend is used from this thread.
        self.device = cuda.select_device(device) if not SIMULATED else cuda.get_current_device()
        self.index = device
        self.compute_capability = tuple(self.device.compute_capability)

    def upload(self, a: np.ndarray):
        return cuda.to_device(np.ascontiguousarray(a))

    def download(self, a) -> np.ndarray:
        return a.copy_to_host()

    def empty(self, shape):
        return cuda.device_array(shape, np.float32)

    def zeros(self, shape):
        return cuda.to_device(np.zeros(shape, np.float32))

    def matmul(self, a, b, trans_a: bool = False, trans_b: bool = False, structure: int = DENSE):
        # The zeros named by A_LOWER/A_UPPER are simply computed here (the same bits).
        if len(a.shape) == 2:
            return self.matmul(a.reshape(1, *a.shape), b.reshape(1, *b.shape), trans_a, trans_b, structure).reshape(
                *self._mm_shape(a.shape, b.shape, trans_a, trans_b))
        m, n = self._mm_shape(a.shape[1:], b.shape[1:], trans_a, trans_b)
        out = self.empty((a.shape[0], m, n))
        grid = (math.ceil(n / TILE), math.ceil(m / TILE), a.shape[0])
        matmul_kernel[grid, (TILE, TILE)](a, b, out, trans_a, trans_b, structure)
        return out

    @staticmethod
    def _mm_shape(a_shape, b_shape, trans_a, trans_b) -> tuple[int, int]:
        return (a_shape[1] if trans_a else a_shape[0]), (b_shape[0] if trans_b else b_shape[1])

    def embed(self, wte, wpe, tokens):
        x = self.empty((tokens.shape[0], wte.shape[1]))
        embed_kernel[_blocks(x.shape[0]), THREADS](wte, wpe, tokens, x)
        return x

    def scatter_add(self, dwte, dx, tokens: np.ndarray) -> None:
        order, starts = positions_by_token(tokens, dwte.shape[0])
        scatter_add_kernel[_blocks(dwte.shape[0]), THREADS](dwte, dx, cuda.to_device(order), cuda.to_device(starts))

    def rmsnorm(self, x, g, eps):
        y, rstd = self.empty(x.shape), self.empty((x.shape[0],))
        rmsnorm_kernel[_blocks(x.shape[0]), THREADS](x, g, eps, self._inv(x.shape[1]), y, rstd)
        return y, rstd

    def rmsnorm_backward(self, x, g, rstd, dy, dres):
        dx, dg_terms = self.empty(x.shape), self.empty(x.shape)
        rmsnorm_backward_kernel[_blocks(x.shape[0]), THREADS](x, g, rstd, dy, dres, self._inv(x.shape[1]), dx, dg_terms)
        return dx, dg_terms

    @staticmethod
    def _inv(n: int) -> np.float32:
        return np.float32(1) / np.float32(n)

    def sum_rows(self, x):
        out = self.empty((x.shape[1],))
        sum_rows_kernel[_blocks(x.shape[1]), THREADS](x, out)
        return out

    def sumsq(self, x) -> np.float32:
        flat = x.reshape(-1)
        partials = self.empty((max(1, math.ceil(flat.shape[0] / K_CHUNK)),))
        chunk_sums_kernel[_blocks(partials.shape[0]), THREADS](flat, True, partials)
        return pairwise_tree(self.download(partials))

    def add(self, a, b):
        out = self.empty((math.prod(a.shape),))
        add_kernel[_blocks(out.shape[0]), THREADS](a.reshape(-1), b.reshape(-1), out)
        return out.reshape(*a.shape)

    def plus_zero(self, a):
        out = self.empty((math.prod(a.shape),))
        plus_zero_kernel[_blocks(out.shape[0]), THREADS](a.reshape(-1), out)
        return out.reshape(*a.shape)

    def gelu(self, u):
        out = self.empty((math.prod(u.shape),))
        gelu_kernel[_blocks(out.shape[0]), THREADS](u.reshape(-1), out)
        return out.reshape(*u.shape)

    def gelu_backward(self, u, dy):
        out = self.empty((math.prod(u.shape),))
        gelu_backward_kernel[_blocks(out.shape[0]), THREADS](u.reshape(-1), dy.reshape(-1), out)
        return out.reshape(*u.shape)

    def split_heads(self, x, col0: int, width: int, seq_len: int, n_heads: int):
        out = self.empty((x.shape[0] // seq_len * n_heads, seq_len, width // n_heads))
        split_heads_kernel[_blocks(x.shape[0]), THREADS](x, out, col0, seq_len, n_heads)
        return out

    def merge_heads(self, o, seq_len: int, n_heads: int):
        out = self.empty((o.shape[0] // n_heads * seq_len, n_heads * o.shape[2]))
        merge_heads_kernel[_blocks(out.shape[0]), THREADS](o, out, 0, seq_len, n_heads)
        return out

    def merge_qkv(self, dq, dk, dv, seq_len: int, n_heads: int):
        d = n_heads * dq.shape[2]
        out = self.empty((dq.shape[0] // n_heads * seq_len, 3 * d))
        for i, part in enumerate((dq, dk, dv)):
            merge_heads_kernel[_blocks(out.shape[0]), THREADS](part, out, i * d, seq_len, n_heads)
        return out

    def causal_softmax(self, s, scale):
        p = self.empty(s.shape)
        softmax_kernel[_blocks(s.shape[0] * s.shape[1]), THREADS](s, scale, p)
        return p

    def causal_softmax_backward(self, p, dp, scale):
        ds = self.empty(p.shape)
        softmax_backward_kernel[_blocks(p.shape[0] * p.shape[1]), THREADS](p, dp, scale, ds)
        return ds

    def cross_entropy(self, logits, targets, inv_n):
        dlogits, row_loss = self.empty(logits.shape), self.empty((logits.shape[0],))
        cross_entropy_kernel[_blocks(logits.shape[0]), THREADS](logits, targets, inv_n, dlogits, row_loss)
        return np.float32(fixed_sum(self.download(row_loss)) * inv_n), dlogits

    def probe(self, x: np.ndarray) -> np.ndarray:
        out = self.empty((PROBE_OUTPUTS,))
        probe_kernel[1, 1](self.upload(x), out)
        return self.download(out)

    def adamw(self, p, g, m, v, scalars: AdamWScalars):
        shape, n = p.shape, math.prod(p.shape)
        outs = [self.empty((n,)) for _ in range(3)]
        adamw_kernel[_blocks(n), THREADS](p.reshape(-1), g.reshape(-1), m.reshape(-1), v.reshape(-1), *outs,
                                          *scalars.args())  # fmt: skip
        return tuple(o.reshape(*shape) for o in outs)
