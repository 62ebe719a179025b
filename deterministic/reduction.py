"""The one summation order every float32 sum of the engine uses.

A sum of n terms ``t_0 … t_{n-1}`` is, by definition:

1. split into consecutive chunks of :data:`K_CHUNK` terms (the last may be shorter);
2. each chunk folded left to right from ``+0.0``: ``s = fadd(s, t)``; a dot product's term is
   ``fmul(a, b)``, rounded before it is added, except in the matmul, whose fold is
   ``s = ffma(a, b, s)`` (fused on every target, by the spec: :mod:`.matmul`);
3. the chunk sums combined by a pairwise tree, level by level: ``(p0+p1), (p2+p3), …``, an odd
   last element carried up unchanged to the next level. No chunks gives ``+0.0``.

The order depends on n alone — never on threads, SIMD width, block or grid size — so a sum is
a pure function of its terms' bits. :data:`K_CHUNK` and :data:`RANK_GROUP` are constants of the
run format: changing either changes the engine version.

Two facts the kernels rely on, both checked by ``tests/deterministic/test_reduction.py``:

* **Streaming form.** The level-by-level tree equals a binary counter over chunk sums: push each
  chunk sum, merging ``stack[level] + value`` while a block of equal size is waiting
  (:func:`stack_push`); at the end combine the waiting blocks from the smallest up
  (:func:`stack_total`). Kernels use this form (O(log n) scratch, no pass over stored partials).
* **Zero padding.** Appending terms that are exactly ``±0.0`` does not change a sum: they form
  chunks and subtrees whose value is ``+0.0``, and ``x + 0.0 == x`` for every x a chunk fold can
  produce (a fold from ``+0.0`` never yields ``-0.0``). Causal attention uses full-length products
  whose masked terms are exactly zero.

:func:`fixed_sum` is the slow, obvious level-by-level version in numpy float32: the reference the
kernels are tested against, and the host's sum of a few values (the per-tensor squared norms).
The kernels here are the sums the model needs beyond rows: column sums (``sum_rows``), the
chunk sums of a long vector (``chunk_sums``, whose tree :func:`pairwise_tree` finishes) and the
elementwise ``add`` of gradient accumulation.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .jit import CPU_OPTIONS, cpu_kernels, device
from .primitives import fadd, fmul

K_CHUNK = 32
"""Terms folded sequentially before a partial sum enters the tree."""

RANK_GROUP = 8
"""Data-parallel ranks per group: a group's gradients are folded in ascending rank order, and
the group sums combined by the same pairwise tree (so the cross-rank sum is this module's order
with ``RANK_GROUP`` in place of ``K_CHUNK``)."""

STACK_DEPTH = 48
"""Levels of the streaming tree's stack: enough for 2**48 chunks."""

ZERO = np.float32(0.0)


@device
def stack_push(stack, count, value):
    """Push the ``count``-th chunk sum (0-based) into the streaming tree; returns ``count + 1``.

    ``stack`` holds the waiting blocks: ``stack[level]`` is the sum of a perfect subtree of
    ``2**level`` chunks, present when bit ``level`` of ``count`` is set.
    """
    level = 0
    while (count >> level) & 1:
        value = fadd(stack[level], value)
        level += 1
    stack[level] = value
    return count + 1


@device
def stack_total(stack, count):
    """The root of the tree after ``count`` pushes: waiting blocks combined smallest first."""
    total = ZERO
    seen = False
    level = 0
    while (count >> level) != 0:
        if (count >> level) & 1:
            if seen:
                total = fadd(stack[level], total)
            else:
                total = stack[level]
                seen = True
        level += 1
    return total


@device
def row_sum(x, stack):
    """Sum of the 1-D float32 array ``x`` in the fixed order (``stack``: STACK_DEPTH scratch)."""
    n = x.shape[0]
    count = 0
    for start in range(0, n, K_CHUNK):
        s = ZERO
        for k in range(start, min(start + K_CHUNK, n)):
            s = fadd(s, x[k])
        count = stack_push(stack, count, s)
    return stack_total(stack, count)


@device
def column_sum(x, c, stack):
    """Sum of column ``c`` of the 2-D array ``x`` over its rows, in the fixed order."""
    n = x.shape[0]
    count = 0
    for start in range(0, n, K_CHUNK):
        s = ZERO
        for r in range(start, min(start + K_CHUNK, n)):
            s = fadd(s, x[r, c])
        count = stack_push(stack, count, s)
    return stack_total(stack, count)


@device
def chunk_sum(x, chunk, square):
    """Fold of chunk ``chunk`` of the 1-D ``x`` from ``+0.0``; of ``fmul(x, x)`` if ``square``."""
    s = ZERO
    for i in range(chunk * K_CHUNK, min((chunk + 1) * K_CHUNK, x.shape[0])):
        s = fadd(s, fmul(x[i], x[i]) if square else x[i])
    return s


COLUMN_BLOCK = 64
"""Columns per parallel task of the CPU ``sum_rows`` (schedule only)."""


def _build(rows, parallel):
    @njit(parallel=parallel, **CPU_OPTIONS)
    def sum_rows(x):
        # Column sums, many columns at a time: lane c of every vector operation is column c's
        # own sequence (fold each chunk of rows from +0.0, push into its own streaming tree).
        n, d = x.shape
        out = np.empty(d, np.float32)
        for task in rows((d + COLUMN_BLOCK - 1) // COLUMN_BLOCK):
            c0, c1 = task * COLUMN_BLOCK, min((task + 1) * COLUMN_BLOCK, d)
            acc = np.empty(c1 - c0, np.float32)
            stack = np.empty((STACK_DEPTH, c1 - c0), np.float32)
            count = 0
            for start in range(0, n, K_CHUNK):
                acc[:] = ZERO
                for r in range(start, min(start + K_CHUNK, n)):
                    for c in range(c1 - c0):
                        acc[c] = fadd(acc[c], x[r, c0 + c])
                level = 0
                while (count >> level) & 1:
                    for c in range(c1 - c0):
                        acc[c] = fadd(stack[level, c], acc[c])
                    level += 1
                stack[level, :] = acc
                count += 1
            for c in range(c1 - c0):
                out[c0 + c] = stack_total(stack[:, c], count)
        return out

    @njit(parallel=parallel, **CPU_OPTIONS)
    def chunk_sums(x, square):
        out = np.empty(max(1, (x.shape[0] + K_CHUNK - 1) // K_CHUNK), np.float32)
        for chunk in rows(out.shape[0]):
            out[chunk] = chunk_sum(x, chunk, square)
        return out

    @njit(parallel=parallel, **CPU_OPTIONS)
    def add(a, b):
        fa, fb = a.reshape(-1), b.reshape(-1)
        out = np.empty_like(fa)
        for i in rows(fa.shape[0]):
            out[i] = fadd(fa[i], fb[i])
        return out.reshape(a.shape)

    @njit(parallel=parallel, **CPU_OPTIONS)
    def plus_zero(a):
        # The first step of a fold from +0.0 (it turns -0.0 into +0.0), without a zeros array.
        fa = a.reshape(-1)
        out = np.empty_like(fa)
        for i in rows(fa.shape[0]):
            out[i] = fadd(ZERO, fa[i])
        return out.reshape(a.shape)

    return sum_rows, chunk_sums, add, plus_zero


KERNELS = cpu_kernels(_build)
"""``{parallel: (sum_rows(x) -> (d,), chunk_sums(x, square) -> (chunks,), add(a, b) -> a + b,
plus_zero(a) -> +0.0 + a)}``."""


def pairwise_tree(partials: np.ndarray) -> np.float32:
    """The pairwise tree over a 1-D float32 array of chunk sums (numpy float32 adds), level by
    level with the odd last element carried up; ``+0.0`` for none."""
    p = np.asarray(partials, np.float32)
    if p.shape[0] == 0:
        return ZERO
    while p.shape[0] > 1:
        pairs = p[: p.shape[0] // 2 * 2]
        nxt = pairs[0::2] + pairs[1::2]
        p = np.concatenate([nxt, p[-1:]]) if p.shape[0] % 2 else nxt
    return np.float32(p[0])


def fixed_sum(terms: np.ndarray, chunk: int = K_CHUNK) -> np.ndarray:
    """Sums over axis 0 of float32 ``terms`` (shape (n, ...)), level by level.

    Vectorised over the trailing axes only; every output element sees exactly the operations
    of the definition above.
    """
    terms = np.asarray(terms, dtype=np.float32)
    n = terms.shape[0]
    partials = []
    for start in range(0, n, chunk):
        s = np.zeros(terms.shape[1:], np.float32)
        for k in range(start, min(start + chunk, n)):
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
