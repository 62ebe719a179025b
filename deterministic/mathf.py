"""Software ``expf``, ``logf`` and ``sigmoidf``: the same bits on every CPU and GPU.

Why not ``math.exp``/``np.exp``: compiled numba calls the platform libm on the CPU and an
``ex2.approx``-based routine on CUDA, so the last bits differ between machines. These functions
use only the primitives of :mod:`.primitives` (each one correctly rounded float32 operation) in a
fixed order, integer operations on exact bit patterns, comparisons and selects. Every constant is
a module-level ``np.float32``.

``expf`` is branch-free so that elementwise loops over it vectorise (GELU and attention call it
millions of times per step): special cases are computed alongside and selected at the end.
Its argument reduction and polynomial are FreeBSD's ``e_expf.c``; ``k`` is ``x/ln2`` rounded to
nearest-even by the ``1.5 * 2**23`` shift trick, and ``2**k`` is applied as two exact powers of
two, ``2**(k >> 1)`` then ``2**(k - (k >> 1))``, so that a subnormal result is rounded once.
``logf`` is FreeBSD's ``e_logf.c`` (it runs once per row of a softmax, so its branches are fine).

Accuracy (``tests/deterministic/test_mathf.py`` against float64 on dense sweeps):
``expf`` and ``logf`` below 1 ulp over their whole finite range.

Special values: ``expf(nan) = nan``, ``expf(x >= 88.7228…) = +inf``, ``expf(x < -103.97…) = +0``;
``logf(±0) = -inf``, ``logf(x < 0) = nan``, ``logf(+inf) = +inf``, ``logf(nan) = nan``.

Subnormal policy (the whole engine's): IEEE gradual underflow is kept. ``expf`` returns
subnormals for x in about [-103.97, -87.34] and ``logf`` accepts subnormal inputs. A process
that flushes subnormals to zero computes other bits; :mod:`.selfcheck` refuses to run in it.
"""

from __future__ import annotations

import numpy as np

from .jit import device
from .primitives import as_float32, as_int32, fadd, fdiv, fmul, fsub

_F = np.float32


def _bits(word: int) -> np.float32:
    return np.uint32(word).view(np.float32)


_ZERO = _F(0.0)
_HALF = _F(0.5)
_ONE = _F(1.0)
_TWO = _F(2.0)
_INF = _F(np.inf)
_NAN = _F(np.nan)

# expf (FreeBSD e_expf.c constants; hex words as in the C source).
EXP_OVERFLOW = _bits(0x42B17218)  # 88.72284: exp(x) rounds to +inf from here on
EXP_UNDERFLOW = _bits(0xC2CFF1B5)  # -103.97208: exp(x) rounds to +0 below this
_LN2_HI = _bits(0x3F317200)  # 6.9314575195e-01; k * _LN2_HI is exact for |k| < 2**9
_LN2_LO = _bits(0x35BFBE8E)  # 1.4286067653e-06
_INV_LN2 = _bits(0x3FB8AA3B)  # 1.4426950216
_ROUND_SHIFT = _F(1.5 * 2.0**23)  # (y + shift) - shift rounds y to an integer, nearest-even
_EXP_P1 = _F(0xAAAA8F * 2.0**-26)  # 1.6666625440e-1 (exact in float32)
_EXP_P2 = _F(-0xB55215 * 2.0**-32)  # -2.7667332906e-3 (exact in float32)

# logf (FreeBSD e_logf.c).
_LOG_LN2_HI = _bits(0x3F317180)  # 6.9313812256e-01
_LOG_LN2_LO = _bits(0x3717F7D1)  # 9.0580006145e-06
_TWO25 = _F(2.0**25)
_LG1 = _F(0xAAAAAA * 2.0**-24)  # 0.66666662693
_LG2 = _F(0xCCCE13 * 2.0**-25)  # 0.40000972152
_LG3 = _F(0x91E9EE * 2.0**-25)  # 0.28498786688
_LG4 = _F(0xF89E26 * 2.0**-26)  # 0.24279078841
_THIRD = _F(1.0 / 3.0)


@device
def expf(x):
    """e**x for a float32 ``x``, as float32 (< 1 ulp, see module doc)."""
    # Clamp into the range where the reduction is valid (nan goes to the low end); the
    # special results are selected at the end.
    xc = x if x > EXP_UNDERFLOW else EXP_UNDERFLOW
    xc = xc if xc < EXP_OVERFLOW else EXP_OVERFLOW
    # x = k*ln2 + r with |r| <= ~0.5*ln2, r carried as hi - lo.
    kf = fsub(fadd(fmul(xc, _INV_LN2), _ROUND_SHIFT), _ROUND_SHIFT)
    hi = fsub(xc, fmul(kf, _LN2_HI))  # exact
    lo = fmul(kf, _LN2_LO)
    r = fsub(hi, lo)
    t = fmul(r, r)
    c = fsub(r, fmul(t, fadd(_EXP_P1, fmul(t, _EXP_P2))))
    y = fsub(_ONE, fsub(fsub(lo, fdiv(fmul(r, c), fsub(_TWO, c))), hi))
    # y * 2**k as two exact scalings, k in [-150, 128]: the first keeps y normal.
    k = np.int32(kf)
    k1 = k >> 1
    scaled = fmul(fmul(y, as_float32((k1 + 127) << 23)), as_float32((k - k1 + 127) << 23))
    out = scaled if x < EXP_OVERFLOW else _INF
    out = out if x >= EXP_UNDERFLOW else _ZERO
    return out if x == x else fadd(x, x)


@device
def logf(x):
    """Natural log of a float32 ``x``, as float32 (< 1 ulp, see module doc)."""
    ix = as_int32(x)
    k = 0
    if ix < 0x00800000:  # x < 2**-126, including negatives and zeros
        if (ix & 0x7FFFFFFF) == 0:
            return -_INF
        if ix < 0:
            return _NAN
        k -= 25  # subnormal: scale up exactly
        x = fmul(x, _TWO25)
        ix = as_int32(x)
    if ix >= 0x7F800000:
        return fadd(x, x)  # +inf or nan
    k += (ix >> 23) - 127
    ix = ix & 0x007FFFFF
    i = (ix + (0x95F64 << 3)) & 0x800000
    x = as_float32(ix | (i ^ 0x3F800000))  # normalise x or x/2 into [sqrt(2)/2, sqrt(2))
    k += i >> 23
    f = fsub(x, _ONE)
    dk = _F(k)
    if (0x007FFFFF & (0x8000 + ix)) < 0xC000:  # -2**-9 <= f < 2**-9
        if f == _ZERO:
            if k == 0:
                return _ZERO
            return fadd(fmul(dk, _LOG_LN2_HI), fmul(dk, _LOG_LN2_LO))
        r = fmul(fmul(f, f), fsub(_HALF, fmul(_THIRD, f)))
        if k == 0:
            return fsub(f, r)
        return fsub(fmul(dk, _LOG_LN2_HI), fsub(fsub(r, fmul(dk, _LOG_LN2_LO)), f))
    s = fdiv(f, fadd(_TWO, f))
    z = fmul(s, s)
    i = ix - (0x6147A << 3)
    w = fmul(z, z)
    j = (0x6B851 << 3) - ix
    t1 = fmul(w, fadd(_LG2, fmul(w, _LG4)))
    t2 = fmul(z, fadd(_LG1, fmul(w, _LG3)))
    i = i | j
    r = fadd(t2, t1)
    if i > 0:
        hfsq = fmul(fmul(_HALF, f), f)
        if k == 0:
            return fsub(f, fsub(hfsq, fmul(s, fadd(hfsq, r))))
        return fsub(fmul(dk, _LOG_LN2_HI), fsub(fsub(hfsq, fadd(fmul(s, fadd(hfsq, r)), fmul(dk, _LOG_LN2_LO))), f))
    if k == 0:
        return fsub(f, fmul(s, fsub(f, r)))
    return fsub(fmul(dk, _LOG_LN2_HI), fsub(fsub(fmul(s, fsub(f, r)), fmul(dk, _LOG_LN2_LO)), f))


@device
def sigmoidf(z):
    """``1 / (1 + expf(-z))``: 0 for z below about -88.7 (expf overflows), 1 for large z."""
    return fdiv(_ONE, fadd(_ONE, expf(-z)))
