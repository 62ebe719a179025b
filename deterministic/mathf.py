"""Software ``expf`` and ``logf`` for float32, identical bits on every CPU and GPU.

Why not ``math.exp``/``np.exp``: compiled numba calls the platform libm on the CPU and an
``ex2.approx``-based routine on CUDA, so the last bits differ between machines. These
functions follow FreeBSD's ``e_expf.c``/``e_logf.c`` (the float-only versions) and use only
float32 ``+ - * /`` in a fixed evaluation order, integer ops on exact bit patterns, and
comparisons. Each of those is correctly rounded IEEE single precision, so the result is a
pure function of the input bits. Every constant is a module-level ``np.float32``: a Python
float literal (``x * 0.5``) would make numba compute in float64 and round differently.

Accuracy (measured by ``tests/deterministic/test_mathf.py`` against float64):
``expf`` < 1 ulp and ``logf`` < 1 ulp over the full finite range.

Special values: ``expf(nan) = nan``, ``expf(+inf) = +inf``, ``expf(-inf) = 0``,
overflow (x > 88.72) gives ``+inf``, deep underflow (x < -103.97) gives ``+0``.
``logf(+0) = logf(-0) = -inf``, ``logf(x<0) = nan``, ``logf(+inf) = +inf``, ``logf(nan) = nan``.

Subnormal policy: IEEE gradual underflow is *kept*. ``expf`` returns subnormals for
x in about [-103.97, -87.34] and ``logf`` accepts subnormal inputs. A process whose FPU
flushes subnormals to zero computes different bits; :func:`.selfcheck.require_deterministic_machine`
refuses to run in it.

Each ``.py_func`` runs the same algorithm on ``np.float32`` scalars; tests check that it gives
the same bits as the compiled version.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .bits import float32_to_int32, int32_to_float32

_F = np.float32

_ZERO = _F(0.0)
_HALF = _F(0.5)
_ONE = _F(1.0)
_TWO = _F(2.0)
_INF = _F(np.inf)
_NAN = _F(np.nan)

# expf constants (FreeBSD e_expf.c); hex words as in the C source.
_EXP_O_THRESHOLD = np.int32(0x42B17180).view(np.float32)  # 88.7216796875
_EXP_U_THRESHOLD = np.uint32(0xC2CFF1B5).view(np.float32)  # -103.97208
_LN2_HI = np.int32(0x3F317200).view(np.float32)  # 6.9314575195e-01, k*_LN2_HI exact
_LN2_LO = np.int32(0x35BFBE8E).view(np.float32)  # 1.4286067653e-06
_INV_LN2 = np.int32(0x3FB8AA3B).view(np.float32)  # 1.4426950216
_EXP_P1 = _F(0xAAAA8F * 2.0**-26)  # 1.6666625440e-1 (exact in float32)
_EXP_P2 = _F(-0xB55215 * 2.0**-32)  # -2.7667332906e-3 (exact in float32)
_TWO_M100 = _F(2.0**-100)
_TWO_P127 = _F(2.0**127)

# logf constants (FreeBSD e_logf.c).
_LOG_LN2_HI = np.int32(0x3F317180).view(np.float32)  # 6.9313812256e-01
_LOG_LN2_LO = np.int32(0x3717F7D1).view(np.float32)  # 9.0580006145e-06
_TWO25 = _F(2.0**25)
_LG1 = _F(0xAAAAAA * 2.0**-24)  # 0.66666662693
_LG2 = _F(0xCCCE13 * 2.0**-25)  # 0.40000972152
_LG3 = _F(0x91E9EE * 2.0**-25)  # 0.28498786688
_LG4 = _F(0xF89E26 * 2.0**-26)  # 0.24279078841
_THIRD = _F(0.33333333333333333)


@njit(cache=True, error_model="numpy", nogil=True)
def expf(x):
    """e**x for a float32 ``x``, returned as float32 (< 1 ulp error, see module doc)."""
    hx = float32_to_int32(x)
    xsb = (hx >> 31) & 1
    hx = hx & 0x7FFFFFFF

    if hx >= 0x42B17218:  # |x| >= 88.72..., or not finite
        if hx > 0x7F800000:
            return x + x  # nan
        if hx == 0x7F800000:
            return x if xsb == 0 else _ZERO
        if x > _EXP_O_THRESHOLD:
            return _INF
        if x < _EXP_U_THRESHOLD:
            return _ZERO

    # Argument reduction x = k*ln2 + r, |r| <= 0.5*ln2, r carried as hi - lo.
    k = 0
    hi = _ZERO
    lo = _ZERO
    if hx > 0x3EB17218:  # |x| > 0.5 ln2
        if hx < 0x3F851592:  # and |x| < 1.5 ln2
            if xsb == 0:
                hi = x - _LN2_HI
                lo = _LN2_LO
                k = 1
            else:
                hi = x + _LN2_HI
                lo = -_LN2_LO
                k = -1
        else:
            kf = _INV_LN2 * x + (_HALF if xsb == 0 else -_HALF)
            k = int(kf)  # truncation toward zero, as the C cast
            t = _F(k)
            hi = x - t * _LN2_HI  # exact: _LN2_HI has trailing zero bits
            lo = t * _LN2_LO
        x = hi - lo
    elif hx < 0x39000000:  # |x| < 2**-14: 1 + x is correctly rounded
        return _ONE + x

    t = x * x
    if k >= -125:
        twopk = int32_to_float32(0x3F800000 + (k << 23))
    else:
        twopk = int32_to_float32(0x3F800000 + ((k + 100) << 23))
    c = x - t * (_EXP_P1 + t * _EXP_P2)
    if k == 0:
        return _ONE - ((x * c) / (c - _TWO) - x)
    y = _ONE - ((lo - (x * c) / (_TWO - c)) - hi)
    if k >= -125:
        if k == 128:
            return y * _TWO * _TWO_P127
        return y * twopk
    # Result is subnormal: scale in two exact-then-one-rounding steps (gradual underflow).
    return y * twopk * _TWO_M100


@njit(cache=True, error_model="numpy", nogil=True)
def logf(x):
    """Natural log of a float32 ``x``, returned as float32 (< 1 ulp error, see module doc)."""
    ix = float32_to_int32(x)
    k = 0
    if ix < 0x00800000:  # x < 2**-126, including negatives and zeros
        if (ix & 0x7FFFFFFF) == 0:
            return -_INF
        if ix < 0:
            return _NAN
        k -= 25  # subnormal: scale up exactly
        x = x * _TWO25
        ix = float32_to_int32(x)
    if ix >= 0x7F800000:
        return x + x  # +inf or nan
    k += (ix >> 23) - 127
    ix = ix & 0x007FFFFF
    i = (ix + (0x95F64 << 3)) & 0x800000
    x = int32_to_float32(ix | (i ^ 0x3F800000))  # normalise x or x/2 into [sqrt(2)/2, sqrt(2))
    k += i >> 23
    f = x - _ONE
    if (0x007FFFFF & (0x8000 + ix)) < 0xC000:  # -2**-9 <= f < 2**-9
        if f == _ZERO:
            if k == 0:
                return _ZERO
            dk = _F(k)
            return dk * _LOG_LN2_HI + dk * _LOG_LN2_LO
        r = f * f * (_HALF - _THIRD * f)
        if k == 0:
            return f - r
        dk = _F(k)
        return dk * _LOG_LN2_HI - ((r - dk * _LOG_LN2_LO) - f)
    s = f / (_TWO + f)
    dk = _F(k)
    z = s * s
    i = ix - (0x6147A << 3)
    w = z * z
    j = (0x6B851 << 3) - ix
    t1 = w * (_LG2 + w * _LG4)
    t2 = z * (_LG1 + w * _LG3)
    i = i | j
    r = t2 + t1
    if i > 0:
        hfsq = _HALF * f * f
        if k == 0:
            return f - (hfsq - s * (hfsq + r))
        return dk * _LOG_LN2_HI - ((hfsq - (s * (hfsq + r) + dk * _LOG_LN2_LO)) - f)
    if k == 0:
        return f - s * (f - r)
    return dk * _LOG_LN2_HI - ((s * (f - r) - dk * _LOG_LN2_LO) - f)


@njit(cache=True, error_model="numpy", nogil=True)
def expf_array(x):
    """Elementwise :func:`expf` of a float32 array (any shape)."""
    flat = x.ravel()
    out = np.empty(flat.shape[0], np.float32)
    for idx in range(flat.shape[0]):
        out[idx] = expf(flat[idx])
    return out.reshape(x.shape)


@njit(cache=True, error_model="numpy", nogil=True)
def logf_array(x):
    """Elementwise :func:`logf` of a float32 array (any shape)."""
    flat = x.ravel()
    out = np.empty(flat.shape[0], np.float32)
    for idx in range(flat.shape[0]):
        out[idx] = logf(flat[idx])
    return out.reshape(x.shape)
