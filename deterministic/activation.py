"""GELU (tanh approximation), forward and backward, elementwise.

``gelu(u) = 0.5·u·(1 + tanh(√(2/π)·(u + 0.044715·u³)))`` is computed in the equivalent form
``u·σ(z)`` with ``z = 2√(2/π)·(u + 0.044715·u³)`` and the software :func:`.mathf.sigmoidf`::

    z = fmul(C2, fadd(u, fmul(C1, fmul(fmul(u, u), u))));   s = sigmoidf(z);   y = fmul(u, s)
    gelu'(u) = fadd(s, fmul(u, fmul(fmul(s, fsub(1, s)), fmul(C2, fadd(1, fmul(C3, fmul(u, u)))))))

with ``C1 = 0.044715``, ``C2 = 2√(2/π)``, ``C3 = 3·C1`` rounded once to float32. The backward
recomputes ``s`` from ``u`` (the same bits) instead of storing it.

Why deterministic: elementwise, a fixed sequence of primitives, no reduction. The loops
vectorise because :func:`.mathf.expf` is branch-free; SIMD lanes compute the same IEEE
operations as scalar code.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .jit import CPU_OPTIONS, cpu_kernels, device
from .mathf import expf, sigmoidf
from .primitives import fadd, fmul, fsub

C1 = np.float32(0.044715)
C2 = np.float32(2.0 * math.sqrt(2.0 / math.pi))
C3 = np.float32(3.0 * 0.044715)
_ONE = np.float32(1.0)


@device
def _gate(u):
    return sigmoidf(fmul(C2, fadd(u, fmul(C1, fmul(fmul(u, u), u)))))


@device
def gelu(u):
    """GELU(u) for a float32 scalar."""
    return fmul(u, _gate(u))


@device
def gelu_backward(u, dy):
    """``dy · gelu'(u)`` for float32 scalars."""
    s = _gate(u)
    dz = fmul(C2, fadd(_ONE, fmul(C3, fmul(u, u))))
    return fmul(dy, fadd(s, fmul(u, fmul(fmul(s, fsub(_ONE, s)), dz))))


def _build(rows, parallel):
    @njit(parallel=parallel, **CPU_OPTIONS)
    def forward(u):
        flat = u.reshape(-1)
        out = np.empty_like(flat)
        for i in rows(flat.shape[0]):
            out[i] = gelu(flat[i])
        return out.reshape(u.shape)

    @njit(parallel=parallel, **CPU_OPTIONS)
    def backward(u, dy):
        fu, fdy = u.reshape(-1), dy.reshape(-1)
        out = np.empty_like(fu)
        for i in rows(fu.shape[0]):
            out[i] = gelu_backward(fu[i], fdy[i])
        return out.reshape(u.shape)

    return forward, backward


KERNELS = cpu_kernels(_build)
"""``{parallel: (forward(u) -> y, backward(u, dy) -> du)}`` over float32 arrays of any shape."""


# ---- references: numpy float32, the same operations, vectorised ------------------------------


def _sigmoid_reference(z):
    with np.errstate(over="ignore"):
        e = np.array([expf(v) for v in (-z).reshape(-1)], np.float32).reshape(z.shape)
    return np.float32(1) / (np.float32(1) + e)


def gelu_reference(u):
    return u * _sigmoid_reference(C2 * (u + C1 * ((u * u) * u)))


def gelu_backward_reference(u, dy):
    s = _sigmoid_reference(C2 * (u + C1 * ((u * u) * u)))
    dz = C2 * (np.float32(1) + C3 * (u * u))
    return dy * (s + u * ((s * (np.float32(1) - s)) * dz))
