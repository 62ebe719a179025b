"""Batched matrix product ``out[b] = op(a[b]) @ op(b[b])`` in the fixed summation order.

Every output element is ``sum_k A[i, k] * B[k, j]`` in the order of :mod:`.reduction`: K split
into chunks of ``K_CHUNK``, each folded left to right from ``+0.0`` with a fused multiply-add,
``s = ffma(A[i, k], B[k, j], s)`` (one rounding per term, on every target), and the chunk sums
combined by the pairwise tree. Nothing else is defined; the CPU kernel below and the CUDA kernel
in :mod:`.cuda` are two schedules of that one order.

Why the CPU kernel is deterministic and fast at once: it computes a tile of outputs at a time
(4 x 16, or 8 x 16 on AVX-512: :data:`TILE_ROWS`, chosen once from the CPU's instruction set),
each output in its own register with its own sequential fold over a chunk — the tile only
decides *which* outputs are in flight together, never the order of any one sum, so the tile's
shape, SIMD lanes (SLP-vectorised, one 16-wide or two 8-wide vectors per row) and threads
change nothing. Threads
(``prange``) split the independent (batch, group of row blocks) tasks. B is packed into
contiguous 16-column panels once, and each task packs its own rows of A (copies: exact);
``trans_a``/``trans_b`` are read while packing, so one compiled kernel serves ``x @ w``,
``dy @ w.T`` and ``x.T @ dy``.

Layouts (all float32, C-contiguous, 3-D — a 2-D product is batch 1)::

    a: (batch, M, K), or (batch, K, M) with trans_a      b: (batch, K, N), or (batch, N, K) with trans_b
    out: (batch, M, N)

An ``epilogue`` (:mod:`.epilogue`) applies the product's elementwise consumer (a residual add,
GELU, GELU's backward) to each task's rows while they are in cache: the same bits as the
separate kernel, one pass fewer over memory.
"""

from __future__ import annotations

import functools

import llvmlite.binding as llvm
import numba
import numpy as np
from numba import njit

from .epilogue import GELU, PLAIN, apply_row, epilogue_reference
from .jit import CPU_OPTIONS, cpu_kernels
from .primitives import fadd, ffma
from .reduction import K_CHUNK, STACK_DEPTH, fixed_sum

NR = 16
"""Columns of the CPU register tile (its rows, 4 or 8, are chosen per instruction set: see
:data:`TILE_ROWS`; neither affects any result)."""
GROUP_ROW_BLOCKS = 8
"""Row blocks per parallel task; each packed B panel is swept by the whole group while it is
in cache (a schedule choice: no effect on any result)."""

# Known structure of causal attention's products (the kernels may exploit it; bits never change):
DENSE = 0
"""No structure."""
CAUSAL_OUTPUT = 1
"""Only outputs with column <= row are wanted; the others are written as +0.0 (Q Kᵀ, dO Vᵀ)."""
A_LOWER = 2
"""A[r, k] is exactly zero for k > r (P and dS on the left: P V, dS K). Chunks past a tile's
last row are trailing zero terms, which the zero-padding fact of :mod:`.reduction` lets a kernel
skip."""
A_UPPER = 3
"""A[r, k] is exactly zero for k < r (Pᵀ dO, dSᵀ Q). Chunks before a tile's first row sum to
+0.0, which a kernel may push into the tree without computing (leading zeros do shape the tree)."""

_ZERO = np.float32(0.0)


# Fold chunk ``[k0, k1)`` of a tile with ``ffma`` and push its sums into the streaming tree
# (:func:`.reduction.stack_push`, one lane per output; ``ap`` (K, rows) and ``bp`` (K, 16) are
# packed operands, ``stack`` (STACK_DEPTH, rows x 16) holds the waiting subtrees); each returns
# ``count + 1``. The accumulators are spelled out because LLVM keeps only scalars in registers;
# SLP packs each row of 16 into one 16-wide or two 8-wide vectors. Each is still its own left fold.


@njit(**CPU_OPTIONS)
def _tile_chunk_4(ap, bp, k0, k1, stack, count):
    """4 x 16: 64 accumulators in 8 AVX2 registers."""
    c00 = c01 = c02 = c03 = c04 = c05 = c06 = c07 = _ZERO
    c08 = c09 = c0a = c0b = c0c = c0d = c0e = c0f = _ZERO
    c10 = c11 = c12 = c13 = c14 = c15 = c16 = c17 = _ZERO
    c18 = c19 = c1a = c1b = c1c = c1d = c1e = c1f = _ZERO
    c20 = c21 = c22 = c23 = c24 = c25 = c26 = c27 = _ZERO
    c28 = c29 = c2a = c2b = c2c = c2d = c2e = c2f = _ZERO
    c30 = c31 = c32 = c33 = c34 = c35 = c36 = c37 = _ZERO
    c38 = c39 = c3a = c3b = c3c = c3d = c3e = c3f = _ZERO
    for k in range(k0, k1):
        a = ap[k]
        b = bp[k]
        a0, a1, a2, a3 = a[0], a[1], a[2], a[3]
        b0, b1, b2, b3, b4, b5, b6, b7 = b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]
        b8, b9, ba, bb, bc, bd, be, bf = b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]
        c00 = ffma(a0, b0, c00); c01 = ffma(a0, b1, c01)
        c02 = ffma(a0, b2, c02); c03 = ffma(a0, b3, c03)
        c04 = ffma(a0, b4, c04); c05 = ffma(a0, b5, c05)
        c06 = ffma(a0, b6, c06); c07 = ffma(a0, b7, c07)
        c08 = ffma(a0, b8, c08); c09 = ffma(a0, b9, c09)
        c0a = ffma(a0, ba, c0a); c0b = ffma(a0, bb, c0b)
        c0c = ffma(a0, bc, c0c); c0d = ffma(a0, bd, c0d)
        c0e = ffma(a0, be, c0e); c0f = ffma(a0, bf, c0f)
        c10 = ffma(a1, b0, c10); c11 = ffma(a1, b1, c11)
        c12 = ffma(a1, b2, c12); c13 = ffma(a1, b3, c13)
        c14 = ffma(a1, b4, c14); c15 = ffma(a1, b5, c15)
        c16 = ffma(a1, b6, c16); c17 = ffma(a1, b7, c17)
        c18 = ffma(a1, b8, c18); c19 = ffma(a1, b9, c19)
        c1a = ffma(a1, ba, c1a); c1b = ffma(a1, bb, c1b)
        c1c = ffma(a1, bc, c1c); c1d = ffma(a1, bd, c1d)
        c1e = ffma(a1, be, c1e); c1f = ffma(a1, bf, c1f)
        c20 = ffma(a2, b0, c20); c21 = ffma(a2, b1, c21)
        c22 = ffma(a2, b2, c22); c23 = ffma(a2, b3, c23)
        c24 = ffma(a2, b4, c24); c25 = ffma(a2, b5, c25)
        c26 = ffma(a2, b6, c26); c27 = ffma(a2, b7, c27)
        c28 = ffma(a2, b8, c28); c29 = ffma(a2, b9, c29)
        c2a = ffma(a2, ba, c2a); c2b = ffma(a2, bb, c2b)
        c2c = ffma(a2, bc, c2c); c2d = ffma(a2, bd, c2d)
        c2e = ffma(a2, be, c2e); c2f = ffma(a2, bf, c2f)
        c30 = ffma(a3, b0, c30); c31 = ffma(a3, b1, c31)
        c32 = ffma(a3, b2, c32); c33 = ffma(a3, b3, c33)
        c34 = ffma(a3, b4, c34); c35 = ffma(a3, b5, c35)
        c36 = ffma(a3, b6, c36); c37 = ffma(a3, b7, c37)
        c38 = ffma(a3, b8, c38); c39 = ffma(a3, b9, c39)
        c3a = ffma(a3, ba, c3a); c3b = ffma(a3, bb, c3b)
        c3c = ffma(a3, bc, c3c); c3d = ffma(a3, bd, c3d)
        c3e = ffma(a3, be, c3e); c3f = ffma(a3, bf, c3f)
    level = 0
    while (count >> level) & 1:
        s = stack[level]
        c00 = fadd(s[0], c00); c01 = fadd(s[1], c01)
        c02 = fadd(s[2], c02); c03 = fadd(s[3], c03)
        c04 = fadd(s[4], c04); c05 = fadd(s[5], c05)
        c06 = fadd(s[6], c06); c07 = fadd(s[7], c07)
        c08 = fadd(s[8], c08); c09 = fadd(s[9], c09)
        c0a = fadd(s[10], c0a); c0b = fadd(s[11], c0b)
        c0c = fadd(s[12], c0c); c0d = fadd(s[13], c0d)
        c0e = fadd(s[14], c0e); c0f = fadd(s[15], c0f)
        c10 = fadd(s[16], c10); c11 = fadd(s[17], c11)
        c12 = fadd(s[18], c12); c13 = fadd(s[19], c13)
        c14 = fadd(s[20], c14); c15 = fadd(s[21], c15)
        c16 = fadd(s[22], c16); c17 = fadd(s[23], c17)
        c18 = fadd(s[24], c18); c19 = fadd(s[25], c19)
        c1a = fadd(s[26], c1a); c1b = fadd(s[27], c1b)
        c1c = fadd(s[28], c1c); c1d = fadd(s[29], c1d)
        c1e = fadd(s[30], c1e); c1f = fadd(s[31], c1f)
        c20 = fadd(s[32], c20); c21 = fadd(s[33], c21)
        c22 = fadd(s[34], c22); c23 = fadd(s[35], c23)
        c24 = fadd(s[36], c24); c25 = fadd(s[37], c25)
        c26 = fadd(s[38], c26); c27 = fadd(s[39], c27)
        c28 = fadd(s[40], c28); c29 = fadd(s[41], c29)
        c2a = fadd(s[42], c2a); c2b = fadd(s[43], c2b)
        c2c = fadd(s[44], c2c); c2d = fadd(s[45], c2d)
        c2e = fadd(s[46], c2e); c2f = fadd(s[47], c2f)
        c30 = fadd(s[48], c30); c31 = fadd(s[49], c31)
        c32 = fadd(s[50], c32); c33 = fadd(s[51], c33)
        c34 = fadd(s[52], c34); c35 = fadd(s[53], c35)
        c36 = fadd(s[54], c36); c37 = fadd(s[55], c37)
        c38 = fadd(s[56], c38); c39 = fadd(s[57], c39)
        c3a = fadd(s[58], c3a); c3b = fadd(s[59], c3b)
        c3c = fadd(s[60], c3c); c3d = fadd(s[61], c3d)
        c3e = fadd(s[62], c3e); c3f = fadd(s[63], c3f)
        level += 1
    s = stack[level]
    s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7] = c00, c01, c02, c03, c04, c05, c06, c07
    s[8], s[9], s[10], s[11], s[12], s[13], s[14], s[15] = c08, c09, c0a, c0b, c0c, c0d, c0e, c0f
    s[16], s[17], s[18], s[19], s[20], s[21], s[22], s[23] = c10, c11, c12, c13, c14, c15, c16, c17
    s[24], s[25], s[26], s[27], s[28], s[29], s[30], s[31] = c18, c19, c1a, c1b, c1c, c1d, c1e, c1f
    s[32], s[33], s[34], s[35], s[36], s[37], s[38], s[39] = c20, c21, c22, c23, c24, c25, c26, c27
    s[40], s[41], s[42], s[43], s[44], s[45], s[46], s[47] = c28, c29, c2a, c2b, c2c, c2d, c2e, c2f
    s[48], s[49], s[50], s[51], s[52], s[53], s[54], s[55] = c30, c31, c32, c33, c34, c35, c36, c37
    s[56], s[57], s[58], s[59], s[60], s[61], s[62], s[63] = c38, c39, c3a, c3b, c3c, c3d, c3e, c3f
    return count + 1


@njit(**CPU_OPTIONS)
def _tile_chunk_8(ap, bp, k0, k1, stack, count):
    """8 x 16: 128 accumulators in 8 AVX-512 registers (4 would leave the fma latency
    exposed; on AVX2 these would need 16 registers and spill)."""
    c00 = c01 = c02 = c03 = c04 = c05 = c06 = c07 = _ZERO
    c08 = c09 = c0a = c0b = c0c = c0d = c0e = c0f = _ZERO
    c10 = c11 = c12 = c13 = c14 = c15 = c16 = c17 = _ZERO
    c18 = c19 = c1a = c1b = c1c = c1d = c1e = c1f = _ZERO
    c20 = c21 = c22 = c23 = c24 = c25 = c26 = c27 = _ZERO
    c28 = c29 = c2a = c2b = c2c = c2d = c2e = c2f = _ZERO
    c30 = c31 = c32 = c33 = c34 = c35 = c36 = c37 = _ZERO
    c38 = c39 = c3a = c3b = c3c = c3d = c3e = c3f = _ZERO
    c40 = c41 = c42 = c43 = c44 = c45 = c46 = c47 = _ZERO
    c48 = c49 = c4a = c4b = c4c = c4d = c4e = c4f = _ZERO
    c50 = c51 = c52 = c53 = c54 = c55 = c56 = c57 = _ZERO
    c58 = c59 = c5a = c5b = c5c = c5d = c5e = c5f = _ZERO
    c60 = c61 = c62 = c63 = c64 = c65 = c66 = c67 = _ZERO
    c68 = c69 = c6a = c6b = c6c = c6d = c6e = c6f = _ZERO
    c70 = c71 = c72 = c73 = c74 = c75 = c76 = c77 = _ZERO
    c78 = c79 = c7a = c7b = c7c = c7d = c7e = c7f = _ZERO
    for k in range(k0, k1):
        a = ap[k]
        b = bp[k]
        a0, a1, a2, a3, a4, a5, a6, a7 = a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]
        b0, b1, b2, b3, b4, b5, b6, b7 = b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]
        b8, b9, ba, bb, bc, bd, be, bf = b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]
        c00 = ffma(a0, b0, c00); c01 = ffma(a0, b1, c01)
        c02 = ffma(a0, b2, c02); c03 = ffma(a0, b3, c03)
        c04 = ffma(a0, b4, c04); c05 = ffma(a0, b5, c05)
        c06 = ffma(a0, b6, c06); c07 = ffma(a0, b7, c07)
        c08 = ffma(a0, b8, c08); c09 = ffma(a0, b9, c09)
        c0a = ffma(a0, ba, c0a); c0b = ffma(a0, bb, c0b)
        c0c = ffma(a0, bc, c0c); c0d = ffma(a0, bd, c0d)
        c0e = ffma(a0, be, c0e); c0f = ffma(a0, bf, c0f)
        c10 = ffma(a1, b0, c10); c11 = ffma(a1, b1, c11)
        c12 = ffma(a1, b2, c12); c13 = ffma(a1, b3, c13)
        c14 = ffma(a1, b4, c14); c15 = ffma(a1, b5, c15)
        c16 = ffma(a1, b6, c16); c17 = ffma(a1, b7, c17)
        c18 = ffma(a1, b8, c18); c19 = ffma(a1, b9, c19)
        c1a = ffma(a1, ba, c1a); c1b = ffma(a1, bb, c1b)
        c1c = ffma(a1, bc, c1c); c1d = ffma(a1, bd, c1d)
        c1e = ffma(a1, be, c1e); c1f = ffma(a1, bf, c1f)
        c20 = ffma(a2, b0, c20); c21 = ffma(a2, b1, c21)
        c22 = ffma(a2, b2, c22); c23 = ffma(a2, b3, c23)
        c24 = ffma(a2, b4, c24); c25 = ffma(a2, b5, c25)
        c26 = ffma(a2, b6, c26); c27 = ffma(a2, b7, c27)
        c28 = ffma(a2, b8, c28); c29 = ffma(a2, b9, c29)
        c2a = ffma(a2, ba, c2a); c2b = ffma(a2, bb, c2b)
        c2c = ffma(a2, bc, c2c); c2d = ffma(a2, bd, c2d)
        c2e = ffma(a2, be, c2e); c2f = ffma(a2, bf, c2f)
        c30 = ffma(a3, b0, c30); c31 = ffma(a3, b1, c31)
        c32 = ffma(a3, b2, c32); c33 = ffma(a3, b3, c33)
        c34 = ffma(a3, b4, c34); c35 = ffma(a3, b5, c35)
        c36 = ffma(a3, b6, c36); c37 = ffma(a3, b7, c37)
        c38 = ffma(a3, b8, c38); c39 = ffma(a3, b9, c39)
        c3a = ffma(a3, ba, c3a); c3b = ffma(a3, bb, c3b)
        c3c = ffma(a3, bc, c3c); c3d = ffma(a3, bd, c3d)
        c3e = ffma(a3, be, c3e); c3f = ffma(a3, bf, c3f)
        c40 = ffma(a4, b0, c40); c41 = ffma(a4, b1, c41)
        c42 = ffma(a4, b2, c42); c43 = ffma(a4, b3, c43)
        c44 = ffma(a4, b4, c44); c45 = ffma(a4, b5, c45)
        c46 = ffma(a4, b6, c46); c47 = ffma(a4, b7, c47)
        c48 = ffma(a4, b8, c48); c49 = ffma(a4, b9, c49)
        c4a = ffma(a4, ba, c4a); c4b = ffma(a4, bb, c4b)
        c4c = ffma(a4, bc, c4c); c4d = ffma(a4, bd, c4d)
        c4e = ffma(a4, be, c4e); c4f = ffma(a4, bf, c4f)
        c50 = ffma(a5, b0, c50); c51 = ffma(a5, b1, c51)
        c52 = ffma(a5, b2, c52); c53 = ffma(a5, b3, c53)
        c54 = ffma(a5, b4, c54); c55 = ffma(a5, b5, c55)
        c56 = ffma(a5, b6, c56); c57 = ffma(a5, b7, c57)
        c58 = ffma(a5, b8, c58); c59 = ffma(a5, b9, c59)
        c5a = ffma(a5, ba, c5a); c5b = ffma(a5, bb, c5b)
        c5c = ffma(a5, bc, c5c); c5d = ffma(a5, bd, c5d)
        c5e = ffma(a5, be, c5e); c5f = ffma(a5, bf, c5f)
        c60 = ffma(a6, b0, c60); c61 = ffma(a6, b1, c61)
        c62 = ffma(a6, b2, c62); c63 = ffma(a6, b3, c63)
        c64 = ffma(a6, b4, c64); c65 = ffma(a6, b5, c65)
        c66 = ffma(a6, b6, c66); c67 = ffma(a6, b7, c67)
        c68 = ffma(a6, b8, c68); c69 = ffma(a6, b9, c69)
        c6a = ffma(a6, ba, c6a); c6b = ffma(a6, bb, c6b)
        c6c = ffma(a6, bc, c6c); c6d = ffma(a6, bd, c6d)
        c6e = ffma(a6, be, c6e); c6f = ffma(a6, bf, c6f)
        c70 = ffma(a7, b0, c70); c71 = ffma(a7, b1, c71)
        c72 = ffma(a7, b2, c72); c73 = ffma(a7, b3, c73)
        c74 = ffma(a7, b4, c74); c75 = ffma(a7, b5, c75)
        c76 = ffma(a7, b6, c76); c77 = ffma(a7, b7, c77)
        c78 = ffma(a7, b8, c78); c79 = ffma(a7, b9, c79)
        c7a = ffma(a7, ba, c7a); c7b = ffma(a7, bb, c7b)
        c7c = ffma(a7, bc, c7c); c7d = ffma(a7, bd, c7d)
        c7e = ffma(a7, be, c7e); c7f = ffma(a7, bf, c7f)
    level = 0
    while (count >> level) & 1:
        s = stack[level]
        c00 = fadd(s[0], c00); c01 = fadd(s[1], c01)
        c02 = fadd(s[2], c02); c03 = fadd(s[3], c03)
        c04 = fadd(s[4], c04); c05 = fadd(s[5], c05)
        c06 = fadd(s[6], c06); c07 = fadd(s[7], c07)
        c08 = fadd(s[8], c08); c09 = fadd(s[9], c09)
        c0a = fadd(s[10], c0a); c0b = fadd(s[11], c0b)
        c0c = fadd(s[12], c0c); c0d = fadd(s[13], c0d)
        c0e = fadd(s[14], c0e); c0f = fadd(s[15], c0f)
        c10 = fadd(s[16], c10); c11 = fadd(s[17], c11)
        c12 = fadd(s[18], c12); c13 = fadd(s[19], c13)
        c14 = fadd(s[20], c14); c15 = fadd(s[21], c15)
        c16 = fadd(s[22], c16); c17 = fadd(s[23], c17)
        c18 = fadd(s[24], c18); c19 = fadd(s[25], c19)
        c1a = fadd(s[26], c1a); c1b = fadd(s[27], c1b)
        c1c = fadd(s[28], c1c); c1d = fadd(s[29], c1d)
        c1e = fadd(s[30], c1e); c1f = fadd(s[31], c1f)
        c20 = fadd(s[32], c20); c21 = fadd(s[33], c21)
        c22 = fadd(s[34], c22); c23 = fadd(s[35], c23)
        c24 = fadd(s[36], c24); c25 = fadd(s[37], c25)
        c26 = fadd(s[38], c26); c27 = fadd(s[39], c27)
        c28 = fadd(s[40], c28); c29 = fadd(s[41], c29)
        c2a = fadd(s[42], c2a); c2b = fadd(s[43], c2b)
        c2c = fadd(s[44], c2c); c2d = fadd(s[45], c2d)
        c2e = fadd(s[46], c2e); c2f = fadd(s[47], c2f)
        c30 = fadd(s[48], c30); c31 = fadd(s[49], c31)
        c32 = fadd(s[50], c32); c33 = fadd(s[51], c33)
        c34 = fadd(s[52], c34); c35 = fadd(s[53], c35)
        c36 = fadd(s[54], c36); c37 = fadd(s[55], c37)
        c38 = fadd(s[56], c38); c39 = fadd(s[57], c39)
        c3a = fadd(s[58], c3a); c3b = fadd(s[59], c3b)
        c3c = fadd(s[60], c3c); c3d = fadd(s[61], c3d)
        c3e = fadd(s[62], c3e); c3f = fadd(s[63], c3f)
        c40 = fadd(s[64], c40); c41 = fadd(s[65], c41)
        c42 = fadd(s[66], c42); c43 = fadd(s[67], c43)
        c44 = fadd(s[68], c44); c45 = fadd(s[69], c45)
        c46 = fadd(s[70], c46); c47 = fadd(s[71], c47)
        c48 = fadd(s[72], c48); c49 = fadd(s[73], c49)
        c4a = fadd(s[74], c4a); c4b = fadd(s[75], c4b)
        c4c = fadd(s[76], c4c); c4d = fadd(s[77], c4d)
        c4e = fadd(s[78], c4e); c4f = fadd(s[79], c4f)
        c50 = fadd(s[80], c50); c51 = fadd(s[81], c51)
        c52 = fadd(s[82], c52); c53 = fadd(s[83], c53)
        c54 = fadd(s[84], c54); c55 = fadd(s[85], c55)
        c56 = fadd(s[86], c56); c57 = fadd(s[87], c57)
        c58 = fadd(s[88], c58); c59 = fadd(s[89], c59)
        c5a = fadd(s[90], c5a); c5b = fadd(s[91], c5b)
        c5c = fadd(s[92], c5c); c5d = fadd(s[93], c5d)
        c5e = fadd(s[94], c5e); c5f = fadd(s[95], c5f)
        c60 = fadd(s[96], c60); c61 = fadd(s[97], c61)
        c62 = fadd(s[98], c62); c63 = fadd(s[99], c63)
        c64 = fadd(s[100], c64); c65 = fadd(s[101], c65)
        c66 = fadd(s[102], c66); c67 = fadd(s[103], c67)
        c68 = fadd(s[104], c68); c69 = fadd(s[105], c69)
        c6a = fadd(s[106], c6a); c6b = fadd(s[107], c6b)
        c6c = fadd(s[108], c6c); c6d = fadd(s[109], c6d)
        c6e = fadd(s[110], c6e); c6f = fadd(s[111], c6f)
        c70 = fadd(s[112], c70); c71 = fadd(s[113], c71)
        c72 = fadd(s[114], c72); c73 = fadd(s[115], c73)
        c74 = fadd(s[116], c74); c75 = fadd(s[117], c75)
        c76 = fadd(s[118], c76); c77 = fadd(s[119], c77)
        c78 = fadd(s[120], c78); c79 = fadd(s[121], c79)
        c7a = fadd(s[122], c7a); c7b = fadd(s[123], c7b)
        c7c = fadd(s[124], c7c); c7d = fadd(s[125], c7d)
        c7e = fadd(s[126], c7e); c7f = fadd(s[127], c7f)
        level += 1
    s = stack[level]
    s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7] = c00, c01, c02, c03, c04, c05, c06, c07
    s[8], s[9], s[10], s[11], s[12], s[13], s[14], s[15] = c08, c09, c0a, c0b, c0c, c0d, c0e, c0f
    s[16], s[17], s[18], s[19], s[20], s[21], s[22], s[23] = c10, c11, c12, c13, c14, c15, c16, c17
    s[24], s[25], s[26], s[27], s[28], s[29], s[30], s[31] = c18, c19, c1a, c1b, c1c, c1d, c1e, c1f
    s[32], s[33], s[34], s[35], s[36], s[37], s[38], s[39] = c20, c21, c22, c23, c24, c25, c26, c27
    s[40], s[41], s[42], s[43], s[44], s[45], s[46], s[47] = c28, c29, c2a, c2b, c2c, c2d, c2e, c2f
    s[48], s[49], s[50], s[51], s[52], s[53], s[54], s[55] = c30, c31, c32, c33, c34, c35, c36, c37
    s[56], s[57], s[58], s[59], s[60], s[61], s[62], s[63] = c38, c39, c3a, c3b, c3c, c3d, c3e, c3f
    s[64], s[65], s[66], s[67], s[68], s[69], s[70], s[71] = c40, c41, c42, c43, c44, c45, c46, c47
    s[72], s[73], s[74], s[75], s[76], s[77], s[78], s[79] = c48, c49, c4a, c4b, c4c, c4d, c4e, c4f
    s[80], s[81], s[82], s[83], s[84], s[85], s[86], s[87] = c50, c51, c52, c53, c54, c55, c56, c57
    s[88], s[89], s[90], s[91], s[92], s[93], s[94], s[95] = c58, c59, c5a, c5b, c5c, c5d, c5e, c5f
    s[96], s[97], s[98], s[99], s[100], s[101], s[102], s[103] = c60, c61, c62, c63, c64, c65, c66, c67
    s[104], s[105], s[106], s[107], s[108], s[109], s[110], s[111] = c68, c69, c6a, c6b, c6c, c6d, c6e, c6f
    s[112], s[113], s[114], s[115], s[116], s[117], s[118], s[119] = c70, c71, c72, c73, c74, c75, c76, c77
    s[120], s[121], s[122], s[123], s[124], s[125], s[126], s[127] = c78, c79, c7a, c7b, c7c, c7d, c7e, c7f
    return count + 1


@njit(**CPU_OPTIONS)
def _tile_total(stack, count, tile):
    """:func:`.reduction.stack_total` for 64 lanes at once, written into ``tile``."""
    tile[:] = _ZERO
    seen = False
    level = 0
    while (count >> level) != 0:
        if (count >> level) & 1:
            if seen:
                for t in range(tile.shape[0]):
                    tile[t] = fadd(stack[level, t], tile[t])
            else:
                tile[:] = stack[level]
                seen = True
        level += 1


@njit(**CPU_OPTIONS)
def _pack_rows(a, bi, rb, trans_a, m, block):
    """Rows ``rb·mr …`` of op(A) into ``block`` (K, mr), zero-padded past the last row."""
    k, mr = block.shape
    rows_here = min(mr, m - rb * mr)
    if trans_a:  # walk the source contiguously
        for kk in range(k):
            for ii in range(rows_here):
                block[kk, ii] = a[bi, kk, rb * mr + ii]
    else:
        for ii in range(rows_here):
            for kk in range(k):
                block[kk, ii] = a[bi, rb * mr + ii, kk]
    for kk in range(k):
        for ii in range(rows_here, mr):
            block[kk, ii] = _ZERO


def _build(rows, parallel, mr):
    """The kernels for an ``mr`` x 16 tile (``mr`` is 4 or 8; a closure constant, so each
    value has its own compiled code and cache entry)."""

    @njit(parallel=parallel, **CPU_OPTIONS)
    def matmul(a, b, trans_a, trans_b, structure, epilogue, extra):
        batch = a.shape[0]
        m = a.shape[2] if trans_a else a.shape[1]
        k = a.shape[1] if trans_a else a.shape[2]
        n = b.shape[1] if trans_b else b.shape[2]
        row_blocks = (m + mr - 1) // mr
        panels = (n + NR - 1) // NR
        # Packed operands, zero-padded to whole tiles (padding rows/columns are never stored).
        # Every element is written by the (parallel) packing loops, so no serial memset first.
        bp = np.empty((batch, panels, k, NR), np.float32)
        for task in rows(batch * panels):
            bi, jp = task // panels, task % panels
            cols_here = min(NR, n - jp * NR)
            if trans_b:
                for jj in range(cols_here):
                    for kk in range(k):
                        bp[bi, jp, kk, jj] = b[bi, jp * NR + jj, kk]
            else:
                for kk in range(k):
                    for jj in range(cols_here):
                        bp[bi, jp, kk, jj] = b[bi, kk, jp * NR + jj]
            for kk in range(k):
                for jj in range(cols_here, NR):
                    bp[bi, jp, kk, jj] = _ZERO
        out = np.empty((batch, m, n), np.float32)
        out2 = np.empty((batch, m, n) if epilogue == GELU else (0, 0, 0), np.float32)
        groups = (row_blocks + GROUP_ROW_BLOCKS - 1) // GROUP_ROW_BLOCKS
        for task in rows(batch * groups):
            bi, g = task // groups, task % groups
            stack = np.empty((STACK_DEPTH, mr * NR), np.float32)
            tile = np.empty(mr * NR, np.float32)
            ap = np.empty((GROUP_ROW_BLOCKS, k, mr), np.float32)  # this group's rows of A, packed
            for rb in range(g * GROUP_ROW_BLOCKS, min((g + 1) * GROUP_ROW_BLOCKS, row_blocks)):
                _pack_rows(a, bi, rb, trans_a, m, ap[rb - g * GROUP_ROW_BLOCKS])
            for jp in range(panels):
                for rb in range(g * GROUP_ROW_BLOCKS, min((g + 1) * GROUP_ROW_BLOCKS, row_blocks)):
                    first_row, first_col = rb * mr, jp * NR
                    if structure == CAUSAL_OUTPUT and first_col > first_row + mr - 1:
                        tile[:] = _ZERO  # every output of the tile is above the diagonal
                    else:
                        count = 0
                        for k0 in range(0, k, K_CHUNK):
                            k1 = min(k0 + K_CHUNK, k)
                            if structure == A_LOWER and k0 > first_row + mr - 1:
                                break  # trailing all-zero chunks: dropping them changes nothing
                            if structure == A_UPPER and k1 <= first_row:
                                k1 = k0  # a leading all-zero chunk: its sum, +0.0, is pushed
                            panel_a, panel_b = ap[rb - g * GROUP_ROW_BLOCKS], bp[bi, jp]
                            if mr == 8:
                                count = _tile_chunk_8(panel_a, panel_b, k0, k1, stack, count)
                            else:
                                count = _tile_chunk_4(panel_a, panel_b, k0, k1, stack, count)
                        _tile_total(stack, count, tile)
                    for ii in range(min(mr, m - first_row)):
                        for jj in range(min(NR, n - first_col)):
                            above = structure == CAUSAL_OUTPUT and first_col + jj > first_row + ii
                            out[bi, first_row + ii, first_col + jj] = _ZERO if above else tile[ii * NR + jj]
            if epilogue != PLAIN:
                # The group's rows of the product are final and still in cache: one pass over each
                # whole row (long runs vectorise; a tile's runs of 16 did not pay for the fusion).
                for row in range(g * GROUP_ROW_BLOCKS * mr, min((g + 1) * GROUP_ROW_BLOCKS * mr, m)):
                    out_row = out[bi, row]
                    apply_row(epilogue, out_row if epilogue == GELU else extra[bi, row], out_row,
                              out2[bi, row] if epilogue == GELU else out_row)  # fmt: skip
        return out, out2

    return matmul


def tile_rows_for(features: str) -> int:
    """Rows of the register tile for an LLVM feature string (``+avx512f,...``): 8 x 16 where a
    row of 16 floats is one AVX-512 register (8 accumulators, which hide the fma latency), 4 x 16
    otherwise (8 AVX2 registers of 8 floats; 8 rows would spill the 16 that AVX2 has)."""
    return 8 if "+avx512f" in features.split(",") else 4


def _target_features() -> str:
    """The features numba compiles for: ``NUMBA_CPU_FEATURES`` (set, or '' for the generic
    target) or the host's. Numba keys its cached code by these, so the tile follows the cache."""
    if numba.config.CPU_FEATURES is not None:
        return numba.config.CPU_FEATURES
    return llvm.get_host_cpu_features().flatten()


TILE_ROWS = tile_rows_for(_target_features())
"""The register tile's rows on this machine, chosen once at import (a schedule: no effect on bits)."""

MATMUL_FUSED_BY_TILE = {mr: cpu_kernels(functools.partial(_build, mr=mr)) for mr in (4, 8)}
"""``{rows: {False: serial, True: parallel}}``: every tile's kernels (each compiles on first use),
``(a, b, trans_a, trans_b, structure, epilogue, extra) -> (out, out2)``: :mod:`.epilogue`'s
``epilogue`` applied to each output as it is stored (``extra`` (batch, M, N) read by ``ADD`` and
``GELU_BACKWARD``; ``out2`` is (0, 0, 0) unless ``GELU``)."""

MATMUL_FUSED = MATMUL_FUSED_BY_TILE[TILE_ROWS]
"""``{False: serial, True: parallel}``: :data:`MATMUL_FUSED_BY_TILE` for this machine's tile."""

NO_EXTRA = np.empty((0, 0, 0), np.float32)
"""The ``extra`` operand of an epilogue that reads none."""


def _plain(kernel):
    def matmul(a, b, trans_a, trans_b, structure):
        return kernel(a, b, trans_a, trans_b, structure, PLAIN, NO_EXTRA)[0]

    return matmul


MATMUL_BY_TILE = {mr: {p: _plain(k) for p, k in kernels.items()} for mr, kernels in MATMUL_FUSED_BY_TILE.items()}
"""The products alone: ``{rows: {parallel: (a, b, trans_a, trans_b, structure) -> out}}``."""

MATMUL = MATMUL_BY_TILE[TILE_ROWS]
"""``{False: serial, True: parallel}`` CPU kernels ``(a, b, trans_a, trans_b, structure) -> out``
for this machine's tile."""


def matmul_reference(a: np.ndarray, b: np.ndarray, trans_a: bool = False, trans_b: bool = False,
                     structure: int = DENSE) -> np.ndarray:
    """Slow, obvious numpy version: the chunk folds with the exact ``ffma`` emulation, vectorised
    over all outputs, then the level-by-level tree of :func:`.reduction.pairwise_tree`. Structure
    only zeroes the unwanted outputs of ``CAUSAL_OUTPUT``; everything else is computed in full."""
    a = np.swapaxes(a, 1, 2) if trans_a else a
    b = np.swapaxes(b, 1, 2) if trans_b else b
    k = a.shape[2]
    partials = []
    for k0 in range(0, k, K_CHUNK):
        s = np.zeros((a.shape[0], a.shape[1], b.shape[2]), np.float32)
        for kk in range(k0, min(k0 + K_CHUNK, k)):
            s = ffma(a[:, :, kk, None], b[:, None, kk, :], s)
        partials.append(s)
    if not partials:
        return np.zeros((a.shape[0], a.shape[1], b.shape[2]), np.float32)
    # The tree over chunk sums: with chunk=1 each is folded from +0.0 alone, which leaves it
    # unchanged (a fold from +0.0 never yields -0.0), so this is the pairwise tree itself.
    out = fixed_sum(np.stack(partials), chunk=1)
    if structure == CAUSAL_OUTPUT:
        out = np.where(np.tri(out.shape[1], out.shape[2], dtype=bool), out, np.float32(0))
    return out


def matmul_fused_reference(a, b, trans_a, trans_b, epilogue: int, extra=None) -> tuple:
    """The unfused composition: :func:`matmul_reference`, then :func:`.epilogue.epilogue_reference`."""
    return epilogue_reference(epilogue, matmul_reference(a, b, trans_a, trans_b), extra)
