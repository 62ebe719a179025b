"""Softmax cross-entropy of next-token targets, forward and backward in one row kernel.

Per row r of logits (V columns) with target t and ``inv_n = fdiv(1, float32(N))`` where N is the
number of target tokens of the whole *step* (all ranks and micro-batches)::

    m = max_j l_j (ascending scan);  e_j = expf(fsub(l_j, m));  s = Σ_j e_j
    loss_r = fsub(logf(s), fsub(l_t, m))
    dl_j = fmul(fsub(fdiv(e_j, s), [j == t]), inv_n)

and a micro-batch's loss is ``fmul(Σ_r loss_r, inv_n)``. Scaling by the step's token count here
makes every micro-batch gradient a share of the step's mean, so gradients are only summed
afterwards (never divided).

Why deterministic: one thread per row, a fixed sequence of primitives, the row sum and the sum
over rows in the order of :mod:`.reduction`, software ``expf``/``logf``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .jit import CPU_OPTIONS, cpu_kernels, device
from .mathf import expf, logf
from .primitives import fadd, fdiv, fmul, fsub
from .reduction import K_CHUNK, STACK_DEPTH, ZERO, fixed_sum, row_sum, stack_push, stack_total

_ONE = np.float32(1.0)


@device
def cross_entropy_row(logits, targets, inv_n, dlogits, row_loss, r, stack):
    v = logits.shape[1]
    m = logits[r, 0]
    for j in range(1, v):
        if logits[r, j] > m:
            m = logits[r, j]
    for j in range(v):
        dlogits[r, j] = expf(fsub(logits[r, j], m))
    count = 0
    for start in range(0, v, K_CHUNK):
        acc = ZERO
        for j in range(start, min(start + K_CHUNK, v)):
            acc = fadd(acc, dlogits[r, j])
        count = stack_push(stack, count, acc)
    s = stack_total(stack, count)
    t = targets[r]
    row_loss[r] = fsub(logf(s), fsub(logits[r, t], m))
    for j in range(v):
        p = fdiv(dlogits[r, j], s)
        if j == t:
            p = fsub(p, _ONE)
        dlogits[r, j] = fmul(p, inv_n)


def _build(rows, parallel):
    @njit(parallel=parallel, **CPU_OPTIONS)
    def cross_entropy(logits, targets, inv_n):
        n = logits.shape[0]
        dlogits = np.empty_like(logits)
        row_loss = np.empty(n, np.float32)
        for r in rows(n):
            cross_entropy_row(logits, targets, inv_n, dlogits, row_loss, r, np.empty(STACK_DEPTH, np.float32))
        return fmul(row_sum(row_loss, np.empty(STACK_DEPTH, np.float32)), inv_n), dlogits

    return cross_entropy


KERNELS = cpu_kernels(_build)
"""``{parallel: cross_entropy(logits, targets, inv_n) -> (loss, dlogits)}``."""


def cross_entropy_reference(logits: np.ndarray, targets: np.ndarray, inv_n: np.float32):
    """numpy float32, the same operations, vectorised over rows (software expf/logf per element)."""
    n = logits.shape[0]
    m = logits.max(axis=1)
    with np.errstate(over="ignore"):
        e = np.array([expf(x) for x in (logits - m[:, None]).reshape(-1)], np.float32).reshape(logits.shape)
    s = fixed_sum(e.T)
    rows = np.arange(n)
    row_loss = np.array([logf(x) for x in s], np.float32) - (logits[rows, targets] - m)
    p = e / s[:, None]
    p[rows, targets] = p[rows, targets] - np.float32(1)
    return fixed_sum(row_loss) * inv_n, p * inv_n
