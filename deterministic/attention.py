"""Causal multi-head self-attention: head layout copies and the causal softmax, both directions.

The attention of one layer is (per batch row b and head h, ``bh = b·H + h``)::

    S = Q Kᵀ                    matmul, reduction over the head dim
    P = causal_softmax(S·scale) row kernel below
    O = P V                     matmul, reduction over all T keys
    dP = dO Vᵀ,  dV = Pᵀ dO     matmuls
    dS = causal_softmax_backward(P, dP)·scale
    dQ = dS K,   dK = dSᵀ Q     matmuls

with ``scale = fdiv(1, fsqrt(head_dim))``. The products are full T x T (:mod:`.matmul`); the
masked entries of P and dS are exactly ``+0.0``, so by the zero-padding fact of
:mod:`.reduction` ``O`` and ``dQ`` equal sums over keys ``j <= i`` only, while ``dV`` and ``dK``
are sums over all T queries with leading zeros — both are simply what the full products define.

Causal softmax of row i (``j <= i``; entries ``j > i`` are written as ``+0.0``)::

    s_j = fmul(S_ij, scale);  m = max_j s_j (ascending scan, first maximum kept)
    e_j = expf(fsub(s_j, m));  l = Σ_{j<=i} e_j;  P_ij = fdiv(e_j, l)

backward: ``D = Σ_{j<=i} fmul(P_ij, dP_ij)``, ``dS_ij = fmul(fmul(P_ij, fsub(dP_ij, D)), scale)``.

Why deterministic: one thread per row, a fixed sequence of primitives, row sums in the order of
:mod:`.reduction` over exactly ``i + 1`` terms; the layout copies do no arithmetic.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .jit import CPU_OPTIONS, cpu_kernels, device
from .mathf import expf
from .primitives import fadd, fdiv, fmul, fsub
from .reduction import K_CHUNK, STACK_DEPTH, ZERO, fixed_sum, stack_push, stack_total


def attention_scale(head_dim: int) -> np.float32:
    """``fdiv(1, fsqrt(head_dim))`` in float32 (numpy's float32 ``/`` and ``sqrt`` are the primitives)."""
    return np.float32(1) / np.sqrt(np.float32(head_dim))


@device
def split_heads_row(x, out, col0, row, seq_len, n_heads):
    """``out[b·H + h, t, e] = x[row, col0 + h·hd + e]`` for ``row = b·T + t`` (copies)."""
    head_dim = out.shape[2]
    b, t = row // seq_len, row % seq_len
    for h in range(n_heads):
        for e in range(head_dim):
            out[b * n_heads + h, t, e] = x[row, col0 + h * head_dim + e]


@device
def merge_heads_row(o, out, col0, row, seq_len, n_heads):
    """``out[row, col0 + h·hd + e] = o[b·H + h, t, e]`` for ``row = b·T + t`` (copies)."""
    head_dim = o.shape[2]
    b, t = row // seq_len, row % seq_len
    for h in range(n_heads):
        for e in range(head_dim):
            out[row, col0 + h * head_dim + e] = o[b * n_heads + h, t, e]


@device
def causal_softmax_row(s, scale, p, bh, i, stack):
    t_len = s.shape[2]
    m = fmul(s[bh, i, 0], scale)
    for j in range(1, i + 1):
        x = fmul(s[bh, i, j], scale)
        if x > m:
            m = x
    for j in range(i + 1):
        p[bh, i, j] = expf(fsub(fmul(s[bh, i, j], scale), m))
    count = 0
    for start in range(0, i + 1, K_CHUNK):
        acc = ZERO
        for j in range(start, min(start + K_CHUNK, i + 1)):
            acc = fadd(acc, p[bh, i, j])
        count = stack_push(stack, count, acc)
    total = stack_total(stack, count)
    for j in range(i + 1):
        p[bh, i, j] = fdiv(p[bh, i, j], total)
    for j in range(i + 1, t_len):
        p[bh, i, j] = ZERO


@device
def causal_softmax_backward_row(p, dp, scale, ds, bh, i, stack):
    t_len = p.shape[2]
    count = 0
    for start in range(0, i + 1, K_CHUNK):
        acc = ZERO
        for j in range(start, min(start + K_CHUNK, i + 1)):
            acc = fadd(acc, fmul(p[bh, i, j], dp[bh, i, j]))
        count = stack_push(stack, count, acc)
    dot = stack_total(stack, count)
    for j in range(i + 1):
        ds[bh, i, j] = fmul(fmul(p[bh, i, j], fsub(dp[bh, i, j], dot)), scale)
    for j in range(i + 1, t_len):
        ds[bh, i, j] = ZERO


def _build(rows, parallel):
    @njit(parallel=parallel, **CPU_OPTIONS)
    def split_heads(x, col0, width, seq_len, n_heads):
        n = x.shape[0]
        out = np.empty((n // seq_len * n_heads, seq_len, width // n_heads), np.float32)
        for row in rows(n):
            split_heads_row(x, out, col0, row, seq_len, n_heads)
        return out

    @njit(parallel=parallel, **CPU_OPTIONS)
    def merge_heads(o, seq_len, n_heads):
        n = o.shape[0] // n_heads * seq_len
        out = np.empty((n, n_heads * o.shape[2]), np.float32)
        for row in rows(n):
            merge_heads_row(o, out, 0, row, seq_len, n_heads)
        return out

    @njit(parallel=parallel, **CPU_OPTIONS)
    def merge_qkv(dq, dk, dv, seq_len, n_heads):
        n = dq.shape[0] // n_heads * seq_len
        d = n_heads * dq.shape[2]
        out = np.empty((n, 3 * d), np.float32)
        for row in rows(n):
            merge_heads_row(dq, out, 0, row, seq_len, n_heads)
            merge_heads_row(dk, out, d, row, seq_len, n_heads)
            merge_heads_row(dv, out, 2 * d, row, seq_len, n_heads)
        return out

    @njit(parallel=parallel, **CPU_OPTIONS)
    def softmax(s, scale):
        bhs, t_len = s.shape[0], s.shape[1]
        p = np.empty_like(s)
        for task in rows(bhs * t_len):
            causal_softmax_row(s, scale, p, task // t_len, task % t_len, np.empty(STACK_DEPTH, np.float32))
        return p

    @njit(parallel=parallel, **CPU_OPTIONS)
    def softmax_backward(p, dp, scale):
        bhs, t_len = p.shape[0], p.shape[1]
        ds = np.empty_like(p)
        for task in rows(bhs * t_len):
            stack = np.empty(STACK_DEPTH, np.float32)
            causal_softmax_backward_row(p, dp, scale, ds, task // t_len, task % t_len, stack)
        return ds

    return split_heads, merge_heads, merge_qkv, softmax, softmax_backward


KERNELS = cpu_kernels(_build)
"""``{parallel: (split_heads, merge_heads, merge_qkv, softmax, softmax_backward)}``."""


# ---- references: numpy float32, the same operations, vectorised over (bh) --------------------


def causal_softmax_reference(s, scale):
    bhs, t_len, _ = s.shape
    p = np.zeros_like(s)
    with np.errstate(over="ignore"):
        for i in range(t_len):
            x = s[:, i, : i + 1] * scale
            e = np.array([expf(v) for v in (x - x.max(axis=1, keepdims=True)).reshape(-1)], np.float32)
            e = e.reshape(bhs, i + 1)
            p[:, i, : i + 1] = e / fixed_sum(e.T)[:, None]
    return p


def causal_softmax_backward_reference(p, dp, scale):
    bhs, t_len, _ = p.shape
    ds = np.zeros_like(p)
    for i in range(t_len):
        pi, dpi = p[:, i, : i + 1], dp[:, i, : i + 1]
        dot = fixed_sum((pi * dpi).T)
        ds[:, i, : i + 1] = (pi * (dpi - dot[:, None])) * scale
    return ds


def split_heads_reference(x, col0, width, seq_len, n_heads):
    part = x[:, col0 : col0 + width].reshape(x.shape[0] // seq_len, seq_len, n_heads, width // n_heads)
    return np.ascontiguousarray(part.transpose(0, 2, 1, 3)).reshape(-1, seq_len, width // n_heads)


def merge_heads_reference(o, seq_len, n_heads):
    bh, t_len, hd = o.shape
    merged = o.reshape(bh // n_heads, n_heads, t_len, hd).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(merged).reshape(-1, n_heads * hd)
