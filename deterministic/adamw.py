"""AdamW (decoupled weight decay) update, with PyTorch's formula and a fixed order.

Why deterministic: elementwise, one rounding per written operation, no fusion, no libm:
bias correction uses the running products ``beta1**t``/``beta2**t`` carried in the state
(multiplied once per step) instead of ``powf``, which differs between C libraries; ``sqrt``
and ``/`` are correctly rounded IEEE operations everywhere.

For step t (``beta1_pow = beta1**t`` and ``beta2_pow = beta2**t`` already include step t)::

    p  = p * (1 - lr * weight_decay)
    m  = beta1 * m + (1 - beta1) * g
    v  = beta2 * v + (1 - beta2) * (g * g)
    p  = p - (lr / (1 - beta1_pow)) * (m / (sqrt(v) / sqrt(1 - beta2_pow) + eps))

All quantities float32; the scalar coefficients are computed once per call in that order.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_ONE = np.float32(1.0)


@njit(cache=True, error_model="numpy", nogil=True)
def adamw_update(p, g, m, v, lr, beta1, beta2, eps, weight_decay, beta1_pow, beta2_pow):
    """New ``(p, m, v)`` arrays after one AdamW step; the inputs are not modified.

    Every scalar must be ``np.float32`` (a Python float would compile a float64 variant).
    """
    decay = _ONE - lr * weight_decay
    one_minus_beta1 = _ONE - beta1
    one_minus_beta2 = _ONE - beta2
    step_size = lr / (_ONE - beta1_pow)
    sqrt_bc2 = np.sqrt(_ONE - beta2_pow)
    p_new = np.empty_like(p)
    m_new = np.empty_like(m)
    v_new = np.empty_like(v)
    fp, fg, fm, fv = p.ravel(), g.ravel(), m.ravel(), v.ravel()
    op, om, ov = p_new.ravel(), m_new.ravel(), v_new.ravel()
    for i in range(fp.shape[0]):
        gi = fg[i]
        mi = beta1 * fm[i] + one_minus_beta1 * gi
        vi = beta2 * fv[i] + one_minus_beta2 * (gi * gi)
        denom = np.sqrt(vi) / sqrt_bc2 + eps
        op[i] = fp[i] * decay - step_size * (mi / denom)
        om[i] = mi
        ov[i] = vi
    return p_new, m_new, v_new


def adamw_update_reference(p, g, m, v, lr, beta1, beta2, eps, weight_decay, beta1_pow, beta2_pow):
    """numpy float32, same order, vectorised (numpy float32 ops round like the kernel's)."""
    f = np.float32
    one = f(1)
    decay = one - lr * weight_decay
    step_size = lr / (one - beta1_pow)
    sqrt_bc2 = np.sqrt(one - beta2_pow)
    m_new = beta1 * m + (one - beta1) * g
    v_new = beta2 * v + (one - beta2) * (g * g)
    denom = np.sqrt(v_new) / sqrt_bc2 + eps
    p_new = p * decay - step_size * (m_new / denom)
    return p_new.astype(f, copy=False), m_new.astype(f, copy=False), v_new.astype(f, copy=False)
