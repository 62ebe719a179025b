"""The same kernels compiled with numba-cuda, and :class:`CudaBackend` over device arrays.

Importing this module binds the primitives to CUDA — ``fadd``/``fsub``/``fmul``/``fdiv``/
``fsqrt``/``ffma`` become the NVVM intrinsics ``add.rn``/``mul.rn``/``div.rn``/``sqrt.rn``/
``fma.rn``, which NVVM and ptxas never contract or split and which keep subnormals — and registers every
:func:`.jit.device` function for the CUDA target. The row and element bodies (``rmsnorm_forward_row``,
``expf``, ``adamw_element``, …) are then the very functions the CPU kernels inline; only the
drivers below (which thread does which row) are CUDA-specific.

Schedules: one thread per output row or element; the matmul is register-blocked (each thread a
4 x 4 tile of outputs of a 64 x 64 block tile, A and B staged in double-buffered shared memory
one ``K_CHUNK`` at a time), and each output's chunk fold and streaming tree are exactly those
of :mod:`.reduction`. Block and grid sizes decide only *which* thread computes an output, never
the order of its sum.

A whole step stays on the device (:meth:`CudaBackend.load_state` … :meth:`CudaBackend.to_state`,
used by :mod:`.step`): the state lives in immutable device arenas (:class:`StateArena`) that a
:class:`TrainState` reads back lazily (:class:`DeviceTensors`), the batch goes up once, and the
gradients with the loss and clip scalars come down, asynchronously, into one pinned buffer for the witness.
Device arrays are leases on a pool (:mod:`.cuda_pool`, ``pool=False`` for numba's allocator):
from a step's second replay on, nothing is allocated.

Under the CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``, process-wide) the kernels run as Python
on the CPU and the bodies run as their numpy emulation; the tests use it at tiny sizes to check
the drivers' logic bit for bit against the CPU backend.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping
from concurrent.futures import Future

import numpy as np
from numba import cuda, float32
from numba.cuda.core import config as cuda_config

from . import primitives
from .activation import gelu, gelu_backward
from .attention import causal_softmax_backward_row, causal_softmax_row, merge_heads_row, split_heads_row
from .cuda_pool import DevicePool, gpu_lease, sim_lease
from .embedding import embed_row, positions_by_token, scatter_add_element
from .epilogue import ADD, GELU, GELU_BACKWARD, PLAIN, apply_row
from .jit import DEVICE_FUNCTIONS
from .loss import cross_entropy_row
from .matmul import A_LOWER, A_UPPER, CAUSAL_OUTPUT, DENSE
from .norm import rmsnorm_backward_row, rmsnorm_forward_row
from .microbatch import micro_batches, pack_batch
from .optimizer import CLIP_EPS, AdamWScalars, adamw_element
from .primitives import fadd, fdiv, ffma, fmul, fsqrt
from .probes import PROBE_OUTPUTS, probe_row
from .reduction import (
    K_CHUNK, STACK_DEPTH, ZERO, chunk_sum, column_sum, pairwise_tree, row_sum, stack_push, stack_total,
)  # fmt: skip
from .state import TrainState
from .witness import StepScalars, witness_async

SIMULATED = bool(cuda_config.ENABLE_CUDASIM)

# Schedules only, no effect on results. The simulator runs every thread as a Python thread, so
# it gets small blocks (which also shows that the block shape does not change any bit).
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


# The matmul's register blocking (schedule constants: they choose which thread computes which
# outputs and when tiles are staged, never the order of any output's sum).
MM_TM = 2 if SIMULATED else 4
"""Output rows per thread."""
MM_TN = 2 if SIMULATED else 4
"""Output columns per thread."""
MM_TY = 2 if SIMULATED else 16
"""Thread rows per block."""
MM_TX = 2 if SIMULATED else 16
"""Thread columns per block."""
MM_BM, MM_BN = MM_TM * MM_TY, MM_TN * MM_TX
MM_THREADS = MM_TX * MM_TY
MM_OUTS = MM_TM * MM_TN
A_LOADS = MM_BM * K_CHUNK // MM_THREADS
"""Elements of A's tile each thread stages per chunk."""
B_LOADS = MM_BN * K_CHUNK // MM_THREADS
PAD = 1
"""Shared tiles are (K_CHUNK, edge + PAD): staging stores walk the K axis with a stride of
edge + 1 words, which touches 32 different banks."""
A_TILE = (2, K_CHUNK, MM_BM + PAD)
B_TILE = (2, K_CHUNK, MM_BN + PAD)
MM_MAX_CHUNKS = 2**24
"""Chunks of K a matmul may have (K < 2**29): bounds the per-thread tree stack (numba zeroes a
local array at kernel start, so it is sized to what can occur, not to STACK_DEPTH)."""
UPPER_LEVELS = (25 - 2, MM_OUTS)
"""Tree levels 2 … 24 (2**24 chunks push at most to level 24)."""


@cuda.jit(device=True)
def _fetch(src, bi, first, extent, k0, k, along_x, t, regs, loads, width):
    """Load this thread's share of the (K_CHUNK x width) tile of ``src`` at chunk ``k0`` and
    columns ``first…`` into ``regs``, zero past ``extent`` or ``k`` (exact: see the kernel doc).
    ``along_x``: ``src`` is (batch, K, X) (consecutive threads walk X), else (batch, X, K)."""
    for q in range(loads):
        e = t + MM_THREADS * q
        x, c = (e % width, e // width) if along_x else (e // K_CHUNK, e % K_CHUNK)
        regs[q] = ZERO
        if first + x < extent and k0 + c < k:
            regs[q] = src[bi, k0 + c, first + x] if along_x else src[bi, first + x, k0 + c]


@cuda.jit(device=True)
def _stage(tile, buf, along_x, t, regs, loads, width):
    """Store :func:`_fetch`'s registers into shared ``tile[buf]`` as (K_CHUNK, width)."""
    for q in range(loads):
        e = t + MM_THREADS * q
        x, c = (e % width, e // width) if along_x else (e // K_CHUNK, e % K_CHUNK)
        tile[buf, c, x] = regs[q]


@cuda.jit(device=True)
def _push(acc, r0, r1, upper, count):
    """:func:`.reduction.stack_push` of every output's chunk sum ``acc[o]`` at once. The tree's
    two lowest levels (touched by every chunk and every other chunk) live in registers ``r0``
    and ``r1``; higher levels in ``upper``, touched once per four chunks."""
    if count & 1 == 0:
        for o in range(MM_OUTS):
            r0[o] = acc[o]
    else:
        for o in range(MM_OUTS):
            acc[o] = fadd(r0[o], acc[o])
        if count & 2 == 0:
            for o in range(MM_OUTS):
                r1[o] = acc[o]
        else:
            for o in range(MM_OUTS):
                acc[o] = fadd(r1[o], acc[o])
            level = 2
            while (count >> level) & 1:
                for o in range(MM_OUTS):
                    acc[o] = fadd(upper[level - 2, o], acc[o])
                level += 1
            for o in range(MM_OUTS):
                upper[level - 2, o] = acc[o]
    return count + 1


@cuda.jit(device=True)
def _total(acc, r0, r1, upper, count):
    """:func:`.reduction.stack_total` of every output into ``acc``: waiting blocks, smallest first."""
    seen = False
    if count & 1:
        for o in range(MM_OUTS):
            acc[o] = r0[o]
        seen = True
    if count & 2:
        for o in range(MM_OUTS):
            acc[o] = fadd(r1[o], acc[o]) if seen else r1[o]
        seen = True
    level = 2
    while (count >> level) != 0:
        if (count >> level) & 1:
            for o in range(MM_OUTS):
                acc[o] = fadd(upper[level - 2, o], acc[o]) if seen else upper[level - 2, o]
            seen = True
        level += 1
    if not seen:
        for o in range(MM_OUTS):
            acc[o] = ZERO


@cuda.jit
def matmul_kernel(a, b, out, trans_a, trans_b, structure, epilogue, extra, out2):
    """Register-blocked ``out[bi] = op(a[bi]) @ op(b[bi])``: a block computes MM_BM x MM_BN
    outputs, each thread MM_TM x MM_TN of them (rows ``ty + MM_TY·i``, columns ``tx + MM_TX·j``,
    so a warp's shared reads are broadcasts or consecutive words).

    Why the bits are the spec's: every output keeps its own accumulator and its own tree. Chunk
    c of K is staged (A and B tiles, double-buffered: chunk c + 1 is read from global memory
    into registers while chunk c is computed) and folded ``acc = ffma(a, b, acc)`` from +0.0 in
    ascending k up to K, then pushed into the output's streaming tree (:func:`_push`); staged
    positions past M or N are +0.0 and never stored. The structure flags
    skip only work whose result is known: tiles wholly above the diagonal (CAUSAL_OUTPUT), chunks
    of A wholly zero after a tile's last row (A_LOWER: trailing zero chunks do not change the
    tree) or before its first row (A_UPPER: their sum, +0.0, is still pushed). The stored
    outputs then go through :func:`.epilogue.apply_row` with ``epilogue`` (their elementwise
    consumer)."""
    m, n = out.shape[1], out.shape[2]
    k = a.shape[1] if trans_a else a.shape[2]
    bi = cuda.blockIdx.z
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    t = ty * MM_TX + tx
    row0, col0 = cuda.blockIdx.y * MM_BM, cuda.blockIdx.x * MM_BN
    if structure == CAUSAL_OUTPUT and col0 > row0 + MM_BM - 1:  # the whole tile is above the diagonal
        for i in range(MM_TM):
            for j in range(MM_TN):
                if row0 + ty + MM_TY * i < m and col0 + tx + MM_TX * j < n:
                    out[bi, row0 + ty + MM_TY * i, col0 + tx + MM_TX * j] = ZERO
        _apply_epilogue(epilogue, extra, out, out2, bi, row0 + ty, col0 + tx, m, n)
        return
    a_tile = cuda.shared.array(A_TILE, float32)
    b_tile = cuda.shared.array(B_TILE, float32)
    a_regs = cuda.local.array(A_LOADS, float32)
    b_regs = cuda.local.array(B_LOADS, float32)
    a_frag = cuda.local.array(MM_TM, float32)
    b_frag = cuda.local.array(MM_TN, float32)
    acc = cuda.local.array(MM_OUTS, float32)
    r0 = cuda.local.array(MM_OUTS, float32)
    r1 = cuda.local.array(MM_OUTS, float32)
    upper = cuda.local.array(UPPER_LEVELS, float32)
    chunks = (k + K_CHUNK - 1) // K_CHUNK
    first, end = 0, chunks
    if structure == A_LOWER:
        end = min(chunks, (row0 + MM_BM - 1) // K_CHUNK + 1)
    elif structure == A_UPPER:
        first = min(chunks, row0 // K_CHUNK)
    count = 0
    for c in range(first):
        for o in range(MM_OUTS):
            acc[o] = ZERO
        count = _push(acc, r0, r1, upper, count)
    if first < end:
        _fetch(a, bi, row0, m, first * K_CHUNK, k, trans_a, t, a_regs, A_LOADS, MM_BM)
        _fetch(b, bi, col0, n, first * K_CHUNK, k, not trans_b, t, b_regs, B_LOADS, MM_BN)
        _stage(a_tile, 0, trans_a, t, a_regs, A_LOADS, MM_BM)
        _stage(b_tile, 0, not trans_b, t, b_regs, B_LOADS, MM_BN)
        cuda.syncthreads()
    for c in range(first, end):
        buf = (c - first) & 1
        more = c + 1 < end
        if more:
            _fetch(a, bi, row0, m, (c + 1) * K_CHUNK, k, trans_a, t, a_regs, A_LOADS, MM_BM)
            _fetch(b, bi, col0, n, (c + 1) * K_CHUNK, k, not trans_b, t, b_regs, B_LOADS, MM_BN)
        for o in range(MM_OUTS):
            acc[o] = ZERO
        for kk in range(min(K_CHUNK, k - c * K_CHUNK)):
            for i in range(MM_TM):
                a_frag[i] = a_tile[buf, kk, ty + MM_TY * i]
            for j in range(MM_TN):
                b_frag[j] = b_tile[buf, kk, tx + MM_TX * j]
            for i in range(MM_TM):
                for j in range(MM_TN):
                    acc[i * MM_TN + j] = ffma(a_frag[i], b_frag[j], acc[i * MM_TN + j])
        if more:
            _stage(a_tile, 1 - buf, trans_a, t, a_regs, A_LOADS, MM_BM)
            _stage(b_tile, 1 - buf, not trans_b, t, b_regs, B_LOADS, MM_BN)
        count = _push(acc, r0, r1, upper, count)
        cuda.syncthreads()
    _total(acc, r0, r1, upper, count)
    for i in range(MM_TM):
        for j in range(MM_TN):
            row, col = row0 + ty + MM_TY * i, col0 + tx + MM_TX * j
            if row < m and col < n:
                above = structure == CAUSAL_OUTPUT and col > row
                out[bi, row, col] = ZERO if above else acc[i * MM_TN + j]
    _apply_epilogue(epilogue, extra, out, out2, bi, row0 + ty, col0 + tx, m, n)


@cuda.jit(device=True)
def _apply_epilogue(epilogue, extra, out, out2, bi, row, col, m, n):
    """:func:`.epilogue.apply_row` on this thread's outputs (rows ``row + MM_TY·i``, columns
    ``col + MM_TX·j``), each a run of one, after it has stored their products: its own writes, read
    back exact. (Applied to ``acc`` instead, the large epilogue body would stop the store loop from
    unrolling, and ``acc``, indexed at run time, would leave the registers for local memory.)"""
    if epilogue != PLAIN:
        for i in range(MM_TM):
            for j in range(MM_TN):
                r, c = row + MM_TY * i, col + MM_TX * j
                if r < m and c < n:
                    o = out[bi, r, c:c + 1]
                    apply_row(epilogue, o if epilogue == GELU else extra[bi, r, c:c + 1], o,
                              out2[bi, r, c:c + 1] if epilogue == GELU else o)  # fmt: skip


@cuda.jit
def embed_kernel(wte, wpe, tokens, x):
    r = cuda.grid(1)
    if r < x.shape[0]:
        embed_row(wte, wpe, tokens, x, r)


@cuda.jit
def scatter_add_kernel(dwte, dx, order, starts):
    i = cuda.grid(1)  # one thread per (token, column): each walks its token's positions in order
    if i < dwte.shape[0] * dwte.shape[1]:
        scatter_add_element(dwte, dx, order, starts, i // dwte.shape[1], i % dwte.shape[1])


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
def zero_kernel(out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = ZERO


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
def loss_kernel(row_loss, inv_n, out):
    if cuda.grid(1) == 0:  # the same fold as the CPU kernel's: fmul(row_sum(row_loss), inv_n)
        out[0] = fmul(row_sum(row_loss, cuda.local.array(STACK_DEPTH, float32)), inv_n)


_ONE = np.float32(1)


@cuda.jit
def clip_kernel(partials, bounds, max_norm, clip_eps, sums, out):
    """``out = [norm, coef]`` from every tensor's chunk sums of squares (tensor t's are
    ``partials[bounds[t]:bounds[t + 1]]``): each tensor's tree, the fixed-order sum over tensors,
    ``fsqrt``, then ``min(1, max_norm / (norm + eps))`` — :meth:`.backend.CpuBackend.clip_norm`'s
    operations, in one thread (a few thousand adds)."""
    if cuda.grid(1) == 0:
        stack = cuda.local.array(STACK_DEPTH, float32)
        for t in range(sums.shape[0]):
            count = 0
            for c in range(bounds[t], bounds[t + 1]):
                count = stack_push(stack, count, partials[c])
            sums[t] = stack_total(stack, count)
        norm = fsqrt(row_sum(sums, stack))
        coef = fdiv(max_norm, fadd(norm, clip_eps))
        out[0] = norm
        out[1] = coef if coef < _ONE else _ONE  # Python's min(1, coef): 1 unless coef < 1


@cuda.jit
def adamw_clip_kernel(p, g, m, v, p_out, m_out, v_out, b1, omb1, b2, omb2, decay, step_size, sqrt_bias2, eps, clip):
    i = cuda.grid(1)
    if i < p.shape[0]:
        adamw_element(p, g, m, v, p_out, m_out, v_out, i, b1, omb1, b2, omb2, decay, step_size, sqrt_bias2, eps,
                      clip[1])  # fmt: skip


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

    def __init__(self, device: int = 0, fused: bool = True, pool: bool = True) -> None:
        # numba keeps the current context per thread: this backend is used from this thread.
        self.device = cuda.select_device(device) if not SIMULATED else cuda.get_current_device()
        self.index = device
        self.compute_capability = tuple(self.device.compute_capability)
        self._uploaded: tuple[weakref.ref, StateArena] | None = None
        self._slots: list[np.ndarray] = []
        self._slot_users: dict[int, Future] = {}
        self._chunk_bounds: dict[tuple, tuple] = {}
        self.live_bytes = self.peak_bytes = 0  # device memory this backend's arrays hold (not numba's caches)
        self.fused = fused
        self.pool = (DevicePool(lambda n: np.empty(n, np.uint8), sim_lease) if SIMULATED else
                     DevicePool(lambda n: cuda.device_array(n, np.uint8), gpu_lease)) if pool else None  # fmt: skip
        self._unpooled = 0
        self._no_tensor = self.empty((1, 1, 1))  # the epilogue operand a plain product does not read

    def upload(self, a: np.ndarray):
        a = np.ascontiguousarray(a)
        if self.pool is None:
            self._unpooled += 1
            return self._count(cuda.to_device(a))
        out = self._count(self.pool.array(a.shape, a.dtype))
        out.copy_to_device(a)
        return out

    def upload_into(self, out, a: np.ndarray) -> None:
        """Host array ``a`` copied into the device array ``out`` (a part of a larger buffer): one
        transfer, as :meth:`upload` makes, into a place already allocated."""
        out.copy_to_device(np.ascontiguousarray(a, np.float32))

    def download(self, a) -> np.ndarray:
        return a.copy_to_host()

    def empty(self, shape):
        if self.pool is None:
            self._unpooled += 1
            return self._count(cuda.device_array(shape, np.float32))
        return self._count(self.pool.array(tuple(shape), np.float32))

    @property
    def allocations(self) -> int:
        """Device allocations this backend has made: the pool's blocks, or (without a pool) every
        array (:mod:`.cuda_pool`)."""
        return self.pool.allocations if self.pool is not None else self._unpooled

    def _count(self, array):
        """Account ``array``'s bytes as live until its memory (shared by every view) is freed."""
        memory = getattr(array, "gpu_data", None)  # the simulator's arrays have none
        if memory is not None:
            self.live_bytes += array.nbytes
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
            weakref.finalize(memory, self._release, array.nbytes)
        return array

    def _release(self, nbytes: int) -> None:
        self.live_bytes -= nbytes

    def reset_peak(self) -> int:
        """Start a new peak of this backend's live device bytes (:attr:`peak_bytes`) from now."""
        self.peak_bytes = self.live_bytes
        return self.live_bytes

    def zeros(self, shape):
        out = self.empty((math.prod(shape),))
        zero_kernel[_blocks(out.shape[0]), THREADS](out)  # no host buffer, no transfer
        return out.reshape(*shape)

    def matmul(self, a, b, trans_a: bool = False, trans_b: bool = False, structure: int = DENSE):
        # The zeros named by A_LOWER/A_UPPER are simply computed here (the same bits).
        return self._matmul(a, b, trans_a, trans_b, structure, PLAIN, None)[0]

    def matmul_add(self, x, a, b, trans_a: bool = False, trans_b: bool = False):
        """``add(x, matmul(a, b, …))`` in one kernel (:data:`.epilogue.ADD`)."""
        return self._matmul(a, b, trans_a, trans_b, DENSE, ADD, x)[0]

    def matmul_gelu(self, a, b, trans_a: bool = False, trans_b: bool = False):
        """``(u, gelu(u))`` of ``u = matmul(a, b, …)`` in one kernel (:data:`.epilogue.GELU`)."""
        return self._matmul(a, b, trans_a, trans_b, DENSE, GELU, None)

    def matmul_gelu_backward(self, u, a, b, trans_a: bool = False, trans_b: bool = False):
        """``gelu_backward(u, matmul(a, b, …))`` in one kernel (:data:`.epilogue.GELU_BACKWARD`)."""
        return self._matmul(a, b, trans_a, trans_b, DENSE, GELU_BACKWARD, u)[0]

    def _matmul(self, a, b, trans_a, trans_b, structure, epilogue, extra):
        """``(out, out2)`` of :func:`matmul_kernel` (``out2`` None unless GELU); 2-D or 3-D operands."""
        flat = len(a.shape) == 2
        if flat:
            a, b = a.reshape(1, *a.shape), b.reshape(1, *b.shape)
            extra = None if extra is None else extra.reshape(1, *extra.shape)
        m, n = self._mm_shape(a.shape[1:], b.shape[1:], trans_a, trans_b)
        if (a.shape[1] if trans_a else a.shape[2]) > MM_MAX_CHUNKS * K_CHUNK:
            raise ValueError(f"matmul: K over {MM_MAX_CHUNKS * K_CHUNK} is not supported on CUDA")
        out = self.empty((a.shape[0], m, n))
        out2 = self.empty((a.shape[0], m, n)) if epilogue == GELU else None
        grid = (math.ceil(n / MM_BN), math.ceil(m / MM_BM), a.shape[0])
        matmul_kernel[grid, (MM_TX, MM_TY)](a, b, out, trans_a, trans_b, structure, epilogue,
                                            self._no_tensor if extra is None else extra,
                                            self._no_tensor if out2 is None else out2)  # fmt: skip
        if flat:
            return out.reshape(m, n), None if out2 is None else out2.reshape(m, n)
        return out, out2

    @staticmethod
    def _mm_shape(a_shape, b_shape, trans_a, trans_b) -> tuple[int, int]:
        return (a_shape[1] if trans_a else a_shape[0]), (b_shape[0] if trans_b else b_shape[1])

    def embed(self, wte, wpe, tokens):
        x = self.empty((tokens.shape[0], wte.shape[1]))
        embed_kernel[_blocks(x.shape[0]), THREADS](wte, wpe, tokens, x)
        return x

    def scatter_add(self, dwte, dx, tokens: np.ndarray) -> None:
        order, starts = positions_by_token(tokens, dwte.shape[0])
        self.scatter_add_sorted(dwte, dx, self.upload(order), self.upload(starts))

    def scatter_add_sorted(self, dwte, dx, order, starts) -> None:
        scatter_add_kernel[_blocks(dwte.shape[0] * dwte.shape[1]), THREADS](dwte, dx, order, starts)

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

    def loss_and_grad(self, logits, targets, inv_n):
        dlogits, row_loss, loss = self.empty(logits.shape), self.empty((logits.shape[0],)), self.empty((1,))
        cross_entropy_kernel[_blocks(logits.shape[0]), THREADS](logits, targets, inv_n, dlogits, row_loss)
        loss_kernel[1, 1](row_loss, inv_n, loss)
        return loss, dlogits

    def cross_entropy(self, logits, targets, inv_n):
        loss, dlogits = self.loss_and_grad(logits, targets, inv_n)
        return np.float32(self.download(loss)[0]), dlogits

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

    # ---- whole-step pieces: the state stays here, one upload per batch, one download per step

    def micro_batches(self, batch: np.ndarray, vocab_size: int):
        packed, layout = pack_batch(batch, vocab_size)
        return micro_batches(self.upload(packed), layout)  # the whole step's tokens in one transfer

    def load_state(self, state: TrainState):
        """The state's arrays on this device: a state this backend produced is already here (its
        arena); another is uploaded as one packed transfer (and kept for the rest of its step)."""
        # The model's lasting device arrays are made first, so the step's later peak is every
        # step's: from the second step on, the pool has every block the step needs.
        self._bounds(tuple(math.prod(shape) for shape in state.config.param_shapes().values()))
        cached = self._uploaded
        if cached is not None and cached[0]() is None:  # its state is gone: free (or pool) its arena
            self._uploaded = cached = None
        if isinstance(state.params, DeviceTensors) and state.params.arena.backend is self:
            return state.params.arena.device_views()
        if cached is not None and cached[0]() is state:
            return cached[1].device_views()
        arena = StateArena.upload(self, state)
        self._uploaded = (weakref.ref(state), arena)
        return arena.device_views()

    def _bounds(self, sizes: tuple[int, ...]):
        """(host, device) chunk bounds of tensors of ``sizes`` for :meth:`clip_norm`: a model's,
        uploaded once, not once per step."""
        if sizes not in self._chunk_bounds:
            chunks = [max(1, math.ceil(n / K_CHUNK)) for n in sizes]
            bounds = np.concatenate([[0], np.cumsum(chunks)]).astype(np.int32)
            self._chunk_bounds = {sizes: (bounds, self.upload(bounds))}
        return self._chunk_bounds[sizes]

    def clip_norm(self, grads: list, max_norm: np.float32):
        bounds, device_bounds = self._bounds(tuple(math.prod(g.shape) for g in grads))
        partials = self.empty((int(bounds[-1]),))
        for g, lo, hi in zip(grads, bounds[:-1].tolist(), bounds[1:].tolist()):
            chunk_sums_kernel[_blocks(hi - lo), THREADS](g.reshape(-1), True, partials[lo:hi])
        clip = self.empty((2,))
        clip_kernel[1, 1](partials, device_bounds, max_norm, CLIP_EPS, self.empty((len(grads),)), clip)
        return clip

    def start_witness(self, loss, grads: dict, order: list[str], clip, rule: str):
        """Start the asynchronous copies of the loss, [norm, coef] and every gradient, each straight
        into its place in one pinned host slot (no device staging copy: that would be 4 more bytes
        a parameter on the device); the returned function waits for them (the update kernels
        launched meanwhile keep the device busy) and hashes in the background.

        The witness's chunks are hashed on the host's cores (:mod:`.witness`), not on the device:
        a 1 MiB chunk (run-format §3) is one serial BLAKE2b of 8,192 compressions, so a `small`
        gradient is 69 serial jobs, too few to fill a GPU, each on one GPU thread whose 64-bit
        rotations are emulated with 32-bit instructions; and the gradients come down anyway, in
        copies the update kernels overlap."""
        shapes = [tuple(grads[n].shape) for n in order]
        sizes = [math.prod(shape) for shape in shapes]
        slot = self._free_slot(3 + sum(sizes))
        stream = cuda.default_stream()
        loss.copy_to_host(slot[0:1], stream=stream)
        clip.copy_to_host(slot[1:3], stream=stream)
        offset = 3
        for name, size in zip(order, sizes):
            grads[name].reshape(size).copy_to_host(slot[offset:offset + size], stream=stream)
            offset += size
        copied = cuda.event()
        copied.record(stream)

        def finish() -> StepScalars:
            copied.synchronize()
            views, offset = {}, 3
            for name, shape, size in zip(order, shapes, sizes):
                views[name] = slot[offset:offset + size].reshape(shape)
                offset += size
            done = witness_async(slot[0], views, order, slot[1], slot[2], rule)
            self._slot_users[id(slot)] = done.witness
            return done

        return finish

    def _free_slot(self, size: int) -> np.ndarray:
        """A pinned host buffer of ``size`` floats that no witness is still being hashed from
        (two alternate, so one step's hash overlaps the next step)."""
        self._slots = [s for s in self._slots if s.shape[0] == size] or [cuda.pinned_array(size, np.float32)
                                                                         for _ in range(2)]  # fmt: skip
        self._slots.append(slot := self._slots.pop(0))
        if (user := self._slot_users.pop(id(slot), None)) is not None:
            user.result()
        return slot

    def adamw_all(self, params: dict, grads: dict, m: dict, v: dict, scalars: dict, clip):
        """Every parameter's update into a new state arena (the old one stays valid for whoever
        still holds the old state)."""
        arena = StateArena(self, {name: p.shape for name, p in params.items()}, self.empty((3 * sum(
            math.prod(p.shape) for p in params.values()),)))  # fmt: skip
        new_p, new_m, new_v = arena.device_views()
        for name in params:
            n = math.prod(params[name].shape)
            flat = [a.reshape(-1) for a in (params[name], grads[name], m[name], v[name], new_p[name], new_m[name],
                                            new_v[name])]  # fmt: skip
            adamw_clip_kernel[_blocks(n), THREADS](*flat, *scalars[name].update_args(), clip)
        return arena

    def to_state(self, config, arena: StateArena, step: int, beta1_pow, beta2_pow) -> TrainState:
        return TrainState(config, *(DeviceTensors(arena, group) for group in range(3)), step, beta1_pow, beta2_pow)


class StateArena:
    """A state's parameters and moments in one device buffer (all parameters, then all first
    moments, then all second moments, each in parameter order), immutable once written. Its host
    copy is made on first request, in one transfer; :meth:`host_tensor` copies one tensor alone."""

    def __init__(self, backend: CudaBackend, shapes: dict, flat) -> None:
        self.backend, self.shapes, self.flat = backend, shapes, flat
        self._host: tuple[dict, dict, dict] | None = None

    @classmethod
    def upload(cls, backend: CudaBackend, state: TrainState) -> StateArena:
        """``state`` uploaded a tensor at a time into its place in the arena: the host holds one
        tensor beyond the state's own (a replay's moments are read from its checkpoint as they are
        asked for, :class:`.checkpoint_stream.FileMoments`), never a packed copy of the state."""
        shapes = {name: tuple(a.shape) for name, a in state.params.items()}
        arena = cls(backend, shapes, backend.empty((3 * sum(math.prod(s) for s in shapes.values()),)))
        for group, views in zip((state.params, state.m, state.v), arena.device_views()):
            for name in shapes:
                backend.upload_into(views[name], group[name])
        return arena

    def _split(self, flat) -> tuple[dict, dict, dict]:
        groups, offset = ({}, {}, {}), 0
        for group in groups:
            for name, shape in self.shapes.items():
                n = math.prod(shape)
                group[name] = flat[offset:offset + n].reshape(*shape)
                offset += n
        return groups

    def device_views(self) -> tuple[dict, dict, dict]:
        return self._split(self.flat)

    def host_tensor(self, group: int, name: str) -> np.ndarray:
        """Tensor ``name`` of ``group`` (0 params, 1 m, 2 v) downloaded alone: the whole host copy
        if it was made, else a transfer of that tensor only, not kept."""
        if self._host is not None:
            return self._host[group][name]
        return self.backend.download(self.device_views()[group][name])

    def host_views(self) -> tuple[dict, dict, dict]:
        if self._host is None:
            host = self.backend.download(self.flat)
            host.flags.writeable = False
            self._host = self._split(host)
        return self._host


class DeviceTensors(Mapping):
    """One group (params, m or v) of a :class:`StateArena` as the read-only host arrays a
    :class:`TrainState` holds; the whole arena is downloaded, once, when one is first read."""

    def __init__(self, arena: StateArena, group: int) -> None:
        self.arena, self.group = arena, group

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arena.host_views()[self.group][name]

    def one(self, name: str) -> np.ndarray:
        """Tensor ``name`` alone (:meth:`StateArena.host_tensor`): what hashing the state a tensor
        at a time reads, without the whole arena on the host."""
        return self.arena.host_tensor(self.group, name)

    def __iter__(self):
        return iter(self.arena.shapes)

    def __len__(self) -> int:
        return len(self.arena.shapes)

    def __reduce__(self):  # pickles as the plain dict it stands for
        return dict, (dict(self.items()),)
