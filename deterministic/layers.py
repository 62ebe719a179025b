"""Embedding, linear and ReLU layers: forward and backward kernels with their references.

Why these are deterministic: every output element is computed by one thread in a fixed
sequence of unfused float32 operations. Dot products and column sums use the order of
:mod:`.reduction` (depends only on the reduction length); the embedding gradient is a
scatter-add in ascending position order with no atomics. No ``fastmath``, no ``prange``.

Shapes: ``x`` (n, d_in), ``w`` (d_in, d_out), ``b`` (d_out,), tokens (n,) int32.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .reduction import K_CHUNK, fixed_dot, fixed_sum, fixed_sum_reference

_ZERO = np.float32(0.0)


@njit(cache=True, error_model="numpy", nogil=True)
def matmul_nt(a, bt):
    """``a @ bt.T`` for C-contiguous float32 ``a`` (m, k) and ``bt`` (n, k), fixed order.

    Both operands are read along contiguous rows; the reduction over k is :func:`fixed_dot`.
    """
    m, k = a.shape
    n = bt.shape[0]
    out = np.empty((m, n), np.float32)
    partials = np.empty(max(1, (k + K_CHUNK - 1) // K_CHUNK), np.float32)
    for i in range(m):
        for j in range(n):
            out[i, j] = fixed_dot(a[i], bt[j], partials)
    return out


@njit(cache=True, error_model="numpy", nogil=True)
def linear_forward(x, w, b):
    """``x @ w + b``; the bias is added once, after the fixed-order dot product."""
    wt = np.ascontiguousarray(w.T)  # a copy: exact
    out = matmul_nt(x, wt)
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            out[i, j] = out[i, j] + b[j]
    return out


@njit(cache=True, error_model="numpy", nogil=True)
def linear_backward(x, w, dy):
    """Gradients ``(dx, dw, db)`` of ``y = x @ w + b`` given ``dy``.

    ``dx = dy @ w.T`` (reduce over d_out), ``dw = x.T @ dy`` and ``db = sum_rows(dy)``
    (reduce over n); all in the fixed order.
    """
    dx = matmul_nt(dy, w)
    dw = matmul_nt(np.ascontiguousarray(x.T), np.ascontiguousarray(dy.T))
    dyt = np.ascontiguousarray(dy.T)
    db = np.empty(dy.shape[1], np.float32)
    partials = np.empty(max(1, (dy.shape[0] + K_CHUNK - 1) // K_CHUNK), np.float32)
    for j in range(dy.shape[1]):
        db[j] = fixed_sum(dyt[j], partials)
    return dx, dw, db


@njit(cache=True, error_model="numpy", nogil=True)
def relu_forward(z):
    """``max(z, 0)``; nan maps to 0 (the comparison is false), as in the backward."""
    out = np.empty_like(z)
    flat_in = z.ravel()
    flat_out = out.ravel()
    for i in range(flat_in.shape[0]):
        flat_out[i] = flat_in[i] if flat_in[i] > _ZERO else _ZERO
    return out


@njit(cache=True, error_model="numpy", nogil=True)
def relu_backward(z, dy):
    """``dy`` where the pre-activation ``z > 0``, else 0 (the subgradient at 0 is 0)."""
    out = np.empty_like(dy)
    fz = z.ravel()
    fdy = dy.ravel()
    fo = out.ravel()
    for i in range(fz.shape[0]):
        fo[i] = fdy[i] if fz[i] > _ZERO else _ZERO
    return out


@njit(cache=True, error_model="numpy", nogil=True)
def embedding_forward(table, tokens):
    """Rows ``table[tokens[p]]``: a gather, no arithmetic."""
    out = np.empty((tokens.shape[0], table.shape[1]), np.float32)
    for p in range(tokens.shape[0]):
        out[p, :] = table[tokens[p], :]
    return out


@njit(cache=True, error_model="numpy", nogil=True)
def embedding_backward(tokens, dx, vocab_size):
    """Gradient of the table: ``d[tokens[p]] += dx[p]`` for p = 0, 1, ... in ascending order.

    A repeated token accumulates its rows in position order (left fold from 0.0), so
    the result depends only on the inputs — never on scheduling.
    """
    d = np.zeros((vocab_size, dx.shape[1]), np.float32)
    for p in range(tokens.shape[0]):
        t = tokens[p]
        for c in range(dx.shape[1]):
            d[t, c] = d[t, c] + dx[p, c]
    return d


# ---- references: slow and obvious, numpy float32 in the same order ---------------------


def matmul_nt_reference(a: np.ndarray, bt: np.ndarray) -> np.ndarray:
    # terms[k, i, j] = a[i, k] * bt[j, k], each product rounded to float32 before summing.
    terms = a.T[:, :, None] * bt.T[:, None, :]
    return fixed_sum_reference(terms)


def linear_forward_reference(x, w, b):
    return matmul_nt_reference(x, np.ascontiguousarray(w.T)) + b[None, :]


def linear_backward_reference(x, w, dy):
    dx = matmul_nt_reference(dy, w)
    dw = matmul_nt_reference(np.ascontiguousarray(x.T), np.ascontiguousarray(dy.T))
    db = fixed_sum_reference(dy)
    return dx, dw, db


def relu_forward_reference(z):
    return np.where(z > 0, z, np.float32(0)).astype(np.float32)


def relu_backward_reference(z, dy):
    return np.where(z > 0, dy, np.float32(0)).astype(np.float32)


def embedding_forward_reference(table, tokens):
    return table[tokens]


def embedding_backward_reference(tokens, dx, vocab_size):
    d = np.zeros((vocab_size, dx.shape[1]), np.float32)
    for p, t in enumerate(tokens):
        d[t] = d[t] + dx[p]
    return d


