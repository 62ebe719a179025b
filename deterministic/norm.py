"""RMSNorm, forward and backward: ``y = (x * rstd) * g`` with ``rstd = 1 / sqrt(mean(x²) + eps)``.

Why deterministic: each row is computed by one thread in a fixed sequence of primitives; the
two row sums (``Σ x²`` forward, ``Σ dxhat·xhat`` backward) use the order of :mod:`.reduction`,
and the gain gradient is a column sum over rows in that order too (:func:`.reduction` via
``sum_rows``). ``mean`` multiplies by ``inv_d = 1 / float32(d)`` (one rounding), never divides.

Per row r (``d`` columns), forward::

    ss = Σ_c fmul(x_c, x_c);   rstd = fdiv(1, fsqrt(fadd(fmul(ss, inv_d), eps)))
    y_c = fmul(fmul(x_c, rstd), g_c)

backward (``xh_c = fmul(x_c, rstd)``, recomputed bit for bit)::

    dxh_c = fmul(dy_c, g_c);   mdot = fmul(Σ_c fmul(dxh_c, xh_c), inv_d)
    dx_c = fadd(dres_c, fmul(fsub(dxh_c, fmul(xh_c, mdot)), rstd))     # + residual gradient
    dg_terms_c = fmul(dy_c, xh_c)                                      # dg = Σ_rows dg_terms
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .jit import CPU_OPTIONS, cpu_kernels, device
from .primitives import fadd, fdiv, fmul, fsqrt, fsub
from .reduction import K_CHUNK, STACK_DEPTH, ZERO, fixed_sum, stack_push, stack_total

_ONE = np.float32(1.0)


@device
def rmsnorm_forward_row(x, g, eps, inv_d, y, rstd, r, stack):
    d = x.shape[1]
    count = 0
    for start in range(0, d, K_CHUNK):
        s = ZERO
        for c in range(start, min(start + K_CHUNK, d)):
            s = fadd(s, fmul(x[r, c], x[r, c]))
        count = stack_push(stack, count, s)
    rs = fdiv(_ONE, fsqrt(fadd(fmul(stack_total(stack, count), inv_d), eps)))
    rstd[r] = rs
    for c in range(d):
        y[r, c] = fmul(fmul(x[r, c], rs), g[c])


@device
def rmsnorm_backward_row(x, g, rstd, dy, dres, inv_d, dx, dg_terms, r, stack):
    d = x.shape[1]
    rs = rstd[r]
    count = 0
    for start in range(0, d, K_CHUNK):
        s = ZERO
        for c in range(start, min(start + K_CHUNK, d)):
            s = fadd(s, fmul(fmul(dy[r, c], g[c]), fmul(x[r, c], rs)))
        count = stack_push(stack, count, s)
    mdot = fmul(stack_total(stack, count), inv_d)
    for c in range(d):
        xh = fmul(x[r, c], rs)
        dx[r, c] = fadd(dres[r, c], fmul(fsub(fmul(dy[r, c], g[c]), fmul(xh, mdot)), rs))
        dg_terms[r, c] = fmul(dy[r, c], xh)


def _build(rows, parallel):
    @njit(parallel=parallel, **CPU_OPTIONS)
    def forward(x, g, eps):
        n, d = x.shape
        inv_d = fdiv(_ONE, np.float32(d))
        y = np.empty_like(x)
        rstd = np.empty(n, np.float32)
        for r in rows(n):
            rmsnorm_forward_row(x, g, eps, inv_d, y, rstd, r, np.empty(STACK_DEPTH, np.float32))
        return y, rstd

    @njit(parallel=parallel, **CPU_OPTIONS)
    def backward(x, g, rstd, dy, dres):
        n, d = x.shape
        inv_d = fdiv(_ONE, np.float32(d))
        dx = np.empty_like(x)
        dg_terms = np.empty_like(x)
        for r in rows(n):
            rmsnorm_backward_row(x, g, rstd, dy, dres, inv_d, dx, dg_terms, r, np.empty(STACK_DEPTH, np.float32))
        return dx, dg_terms

    return forward, backward


KERNELS = cpu_kernels(_build)
"""``{parallel: (forward(x, g, eps) -> (y, rstd), backward(x, g, rstd, dy, dres) -> (dx, dg_terms))}``."""


# ---- references: numpy float32, the same operations, vectorised over rows --------------------


def rmsnorm_forward_reference(x, g, eps):
    inv_d = np.float32(1) / np.float32(x.shape[1])
    ss = fixed_sum((x * x).T)
    rstd = np.float32(1) / np.sqrt(ss * inv_d + eps)
    return (x * rstd[:, None]) * g, rstd


def rmsnorm_backward_reference(x, g, rstd, dy, dres):
    inv_d = np.float32(1) / np.float32(x.shape[1])
    xh = x * rstd[:, None]
    dxh = dy * g
    mdot = fixed_sum((dxh * xh).T) * inv_d
    return dres + (dxh - xh * mdot[:, None]) * rstd[:, None], dy * xh
