"""Scalar probes of a target's float32 arithmetic, run by :mod:`.selfcheck` on every backend.

One device body, :func:`probe_row`, computes a fixed set of results whose exact bits are known
(their meaning is documented in :mod:`.selfcheck`); the CPU kernel here and the one-thread CUDA
kernel in :mod:`.cuda` run that same body, so a probe on a GPU tests the GPU's code path — the
``.rn`` bindings of the primitives and the device's handling of subnormals — not the CPU's.

Inputs (``PROBE_INPUTS``) and outputs, all float32::

    out[0] = fadd(fmul(x0, x1), x2)   fusion: 0.0 unless a*b + c was contracted into an fma
    out[1] = fmul(x3, x4)             flush-to-zero: a subnormal unless results are flushed
    out[2] = fmul(x5, x6)             denormals-are-zero: 2**-125 unless subnormal inputs read as 0
    out[3] = expf(x7)                 software expf(1)
    out[4] = logf(x8)                 software logf(3)
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .jit import CPU_OPTIONS, device
from .mathf import expf, logf
from .primitives import fadd, fmul

_F = np.float32
FUSION_A = _F(1 + 2.0**-12)
FUSION_C = _F(-(1 + 2.0**-11))
"""``a*a + c``: a*a = 1 + 2**-11 + 2**-24 rounds to 1 + 2**-11, so the unfused result is 0;
a fused multiply-add keeps the 2**-24."""
SMALLEST_SUBNORMAL = np.uint32(1).view(np.float32)

PROBE_INPUTS = np.array(
    [FUSION_A, FUSION_A, FUSION_C, 1e-38, 1e-3, SMALLEST_SUBNORMAL, 2.0**24, 1.0, 3.0], np.float32)
PROBE_OUTPUTS = 5


@device
def probe_row(x, out):
    out[0] = fadd(fmul(x[0], x[1]), x[2])
    out[1] = fmul(x[3], x[4])
    out[2] = fmul(x[5], x[6])
    out[3] = expf(x[7])
    out[4] = logf(x[8])


@njit(**CPU_OPTIONS)
def probe_cpu(x):
    out = np.empty(PROBE_OUTPUTS, np.float32)
    probe_row(x, out)
    return out
