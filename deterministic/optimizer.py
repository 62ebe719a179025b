"""Global-norm gradient clipping and AdamW (decoupled weight decay), PyTorch's formulas.

Clipping: ``sumsq(G) = Σ fmul(g, g)`` over each gradient tensor's flat elements in the order of
:mod:`.reduction`; the tensors' sums combined by that order again, in parameter order;
``norm = fsqrt(total)``; ``coef = min(1, fdiv(max_norm, fadd(norm, 1e-6)))``. Multiplying by
``coef = 1`` is exact, so an unclipped step is unchanged.

AdamW, step t (``beta1_pow = beta1**t``, ``beta2_pow = beta2**t`` carried in the state and
multiplied once per step — never ``powf``, which differs between C libraries)::

    g  = fmul(g, coef)
    m  = fadd(fmul(beta1, m), fmul(1 - beta1, g))
    v  = fadd(fmul(beta2, v), fmul(1 - beta2, fmul(g, g)))
    p  = fsub(fmul(p, 1 - lr·wd), fmul(lr / (1 - beta1_pow), fdiv(m, fadd(fdiv(fsqrt(v), sqrt(1 - beta2_pow)), eps))))

The scalar coefficients are float32 operations done once per step on the host (numpy float32
arithmetic is the same IEEE single precision). Weight decay applies to matrices, not to gains.

Why deterministic: elementwise, one rounding per primitive, no libm; ``sqrt`` and ``/`` are
correctly rounded everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from .jit import CPU_OPTIONS, cpu_kernels, device
from .primitives import fadd, fdiv, fmul, fsqrt, fsub

_F = np.float32
CLIP_EPS = _F(1e-6)


@dataclass(frozen=True)
class AdamWScalars:
    """The per-step float32 coefficients of one parameter's update."""

    beta1: np.float32
    one_minus_beta1: np.float32
    beta2: np.float32
    one_minus_beta2: np.float32
    decay: np.float32
    step_size: np.float32
    sqrt_bias2: np.float32
    eps: np.float32
    coef: np.float32 | None = None
    """The clipping coefficient; None where a backend supplies it from the device (:meth:`update_args`)."""

    @classmethod
    def for_step(cls, *, lr, beta1, beta2, eps, weight_decay, beta1_pow, beta2_pow, coef=None) -> AdamWScalars:
        one = _F(1)
        return cls(
            beta1=beta1, one_minus_beta1=one - beta1, beta2=beta2, one_minus_beta2=one - beta2,
            decay=one - lr * weight_decay, step_size=lr / (one - beta1_pow), sqrt_bias2=np.sqrt(one - beta2_pow),
            eps=eps, coef=coef,
        )  # fmt: skip

    def update_args(self) -> tuple[np.float32, ...]:
        """Every coefficient but ``coef``, in the kernels' argument order."""
        return (self.beta1, self.one_minus_beta1, self.beta2, self.one_minus_beta2, self.decay, self.step_size,
                self.sqrt_bias2, self.eps)  # fmt: skip

    def args(self) -> tuple[np.float32, ...]:
        if self.coef is None:
            raise ValueError("AdamWScalars.args() needs the clipping coefficient")
        return (*self.update_args(), self.coef)


def clip_coefficient(norm: np.float32, max_norm: np.float32) -> np.float32:
    """``min(1, max_norm / (norm + 1e-6))`` in float32."""
    return min(_F(1), _F(max_norm / (norm + CLIP_EPS)))


@device
def adamw_element(p, g, m, v, p_out, m_out, v_out, i, b1, omb1, b2, omb2, decay, step_size, sqrt_bias2, eps, coef):
    gi = fmul(g[i], coef)
    mi = fadd(fmul(b1, m[i]), fmul(omb1, gi))
    vi = fadd(fmul(b2, v[i]), fmul(omb2, fmul(gi, gi)))
    denom = fadd(fdiv(fsqrt(vi), sqrt_bias2), eps)
    p_out[i] = fsub(fmul(p[i], decay), fmul(step_size, fdiv(mi, denom)))
    m_out[i] = mi
    v_out[i] = vi


def _build(rows, parallel):
    @njit(parallel=parallel, **CPU_OPTIONS)
    def adamw(p, g, m, v, b1, omb1, b2, omb2, decay, step_size, sqrt_bias2, eps, coef):
        fp, fg, fm, fv = p.reshape(-1), g.reshape(-1), m.reshape(-1), v.reshape(-1)
        p_out, m_out, v_out = np.empty_like(fp), np.empty_like(fp), np.empty_like(fp)
        for i in rows(fp.shape[0]):
            adamw_element(fp, fg, fm, fv, p_out, m_out, v_out, i, b1, omb1, b2, omb2, decay, step_size, sqrt_bias2,
                          eps, coef)  # fmt: skip
        return p_out.reshape(p.shape), m_out.reshape(p.shape), v_out.reshape(p.shape)

    return adamw


KERNELS = cpu_kernels(_build)
"""``{parallel: adamw(p, g, m, v, *AdamWScalars.args()) -> (p, m, v)}`` (new arrays)."""


def adamw_reference(p, g, m, v, s: AdamWScalars):
    g = g * s.coef
    m = s.beta1 * m + s.one_minus_beta1 * g
    v = s.beta2 * v + s.one_minus_beta2 * (g * g)
    return p * s.decay - s.step_size * (m / (np.sqrt(v) / s.sqrt_bias2 + s.eps)), m, v
