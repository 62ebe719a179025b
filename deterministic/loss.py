"""Mean softmax cross-entropy over rows of logits, forward and backward in one kernel.

Why deterministic: each row is processed alone in a fixed sequence — max, ``e = expf(l - max)``
with the software :func:`.mathf.expf`, the row sum in the :mod:`.reduction` order, ``logf``
of it — and the mean is a fixed-order sum of row losses times ``1/n`` (a float32 reciprocal
computed once; multiplying, not dividing, is the rule every implementation must follow).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .mathf import expf, expf_array, logf, logf_array
from .reduction import K_CHUNK, fixed_sum, fixed_sum_reference

_ONE = np.float32(1.0)


@njit(cache=True, error_model="numpy", nogil=True)
def softmax_cross_entropy(logits, targets):
    """``(loss, dlogits)`` of mean cross-entropy of ``targets`` (n,) under ``logits`` (n, v).

    Per row: ``m = max(l)``, ``e_j = expf(l_j - m)``, ``s = sum(e)``,
    ``loss_r = logf(s) - (l_t - m)``, ``dlogits_rj = (e_j / s - [j == t]) * inv_n``
    with ``inv_n = 1 / float32(n)``; ``loss = sum(loss_r) * inv_n``.
    """
    n, v = logits.shape
    inv_n = _ONE / np.float32(n)
    row_loss = np.empty(n, np.float32)
    dlogits = np.empty((n, v), np.float32)
    e = np.empty(v, np.float32)
    partials = np.empty(max(1, (max(n, v) + K_CHUNK - 1) // K_CHUNK), np.float32)
    for r in range(n):
        m = logits[r, 0]
        for j in range(1, v):
            if logits[r, j] > m:
                m = logits[r, j]
        for j in range(v):
            e[j] = expf(logits[r, j] - m)
        s = fixed_sum(e, partials)
        t = targets[r]
        row_loss[r] = logf(s) - (logits[r, t] - m)
        for j in range(v):
            p = e[j] / s
            if j == t:
                p = p - _ONE
            dlogits[r, j] = p * inv_n
    loss = fixed_sum(row_loss, partials) * inv_n
    return loss, dlogits


def softmax_cross_entropy_reference(logits: np.ndarray, targets: np.ndarray):
    """numpy float32 version of the same order, vectorised over rows.

    Uses the compiled elementwise ``expf``/``logf`` (tested bit-exact against their own
    numpy emulation in ``test_mathf``).
    """
    n, v = logits.shape
    inv_n = np.float32(1) / np.float32(n)
    m = logits.max(axis=1)
    e = expf_array(logits - m[:, None])
    s = fixed_sum_reference(e.T)  # reduce over columns, per row
    rows = np.arange(n)
    row_loss = logf_array(s) - (logits[rows, targets] - m)
    p = e / s[:, None]
    p[rows, targets] = p[rows, targets] - np.float32(1)
    return fixed_sum_reference(row_loss) * inv_n, p * inv_n
