"""The engine's float32 arithmetic in plain numpy, vectorised: the referee's primitives.

numpy's float32 ``+ - * /`` and ``sqrt`` on float32 arrays are single IEEE-754 operations,
correctly rounded to nearest-even, never contracted, subnormals kept: exactly the engine's
``fadd``/``fsub``/``fmul``/``fdiv``/``fsqrt`` (docs/protocol.md §18.4). What numpy lacks is the
fused multiply-add the matmul's fold is specified with, and the engine's software ``expf`` and
``logf`` (libm's differ between machines). This module supplies the three, over arrays, from
those primitives and exact float64 steps only. Every constant is an ``np.float32``: a Python
float operand would promote a computation to float64.

This module needs numpy; nothing in ``open1b.protocol`` imports it at import time (only
:func:`.referee.recompute` does, when a proof is judged).
"""

from __future__ import annotations

import numpy as np

F = np.float32
_F32_MAX = float(np.finfo(np.float32).max)
_OVERFLOW_MIDPOINT = _F32_MAX + 2.0**103
"""max + half an ulp: where float32 rounding goes to infinity (as if 2**128 were the next float)."""


def ffma(a, b, c) -> np.ndarray:
    """``a * b + c`` with one rounding to float32 (arrays broadcast; float32 in, float32 out).

    Why this is exact. Let x be the exact value a·b + c.
    (1) ``p = a*b`` in float64 is exact: two 24-bit significands make at most 48 bits, and the
        exponent range of float32 products (2**-298 … 2**256) is inside float64's normal range.
    (2) ``t = p + c`` in float64 is RN64(x), and TwoSum gives ``e`` with ``t + e == x`` exactly
        (Knuth; no overflow is possible since |p| < 2**256).
    (3) Rounding t to float32 equals rounding x *unless t is a float32 midpoint*. Every float32
        midpoint (and the overflow boundary) is a float64 number, so none can lie strictly
        between x and t: it would be a float64 closer to x than RN64(x). Hence when t is not a
        midpoint, x and t fall between the same two midpoints and round alike.
    (4) When t is a midpoint: e == 0 is a true tie (numpy's cast rounds it to even, like the
        hardware); otherwise x lies on the side of t given by the sign of e, and the result is
        the neighbour on that side. This is the double-rounding case a naive float64 fma gets
        wrong (tests/protocol/test_dispute_float32.py builds such cases and compares with the
        kernels' hardware fma).
    Zeros, infinities and NaNs follow float64's IEEE rules, which are float32's: e is then
    0 or NaN, and the cast alone decides.

    Speed: a float32 midpoint has at most 25 significant bits, so as a float64 the low 28 bits
    of its significand are zero (subnormal float32 midpoints and the overflow boundary have even
    fewer bits). Only lanes whose t has those bits zero can be in case (4); TwoSum and the
    neighbour are computed for them alone.
    """
    a, b, c = np.broadcast_arrays(*(np.asarray(v, np.float32) for v in (a, b, c)))
    with np.errstate(invalid="ignore", over="ignore"):
        p = a.astype(np.float64) * b
        t = p + c
        out = t.astype(np.float32)
        maybe = (t.view(np.int64) & _LOW_28) == 0
        if maybe.any():
            out[maybe] = _round_exactly(p[maybe], c[maybe].astype(np.float64), t[maybe], out[maybe])
    return out


_LOW_28 = np.int64((1 << 28) - 1)


def _round_exactly(p, c, t, r):
    """Steps (2)–(4) of :func:`ffma` for lanes that may sit on a midpoint (1-D arrays)."""
    bv = t - p
    e = (p - (t - bv)) + (c - bv)  # TwoSum: t + e == p + c exactly
    r64 = r.astype(np.float64)
    # the float32 on the other side of t from r, and the midpoint between the two
    other = np.where(r64 > t, np.nextafter(r, F(-np.inf)), np.nextafter(r, F(np.inf)))
    mid = (r64 + other.astype(np.float64)) / 2  # exact: both are float32, so their mean is a float64
    mid = np.where(np.isinf(r) | np.isinf(other), np.copysign(_OVERFLOW_MIDPOINT, t), mid)
    tie = (t == mid) & (e != 0) & np.isfinite(e)
    toward = np.where(e > 0, np.maximum(r, other), np.minimum(r, other))
    return np.where(tie, toward, r)


# ---- expf: FreeBSD e_expf.c, branch-free, as deterministic/mathf.py specifies it -------------

def _bits(word: int) -> np.float32:
    return np.uint32(word).view(np.float32)


EXP_OVERFLOW = _bits(0x42B17218)
EXP_UNDERFLOW = _bits(0xC2CFF1B5)
_LN2_HI = _bits(0x3F317200)
_LN2_LO = _bits(0x35BFBE8E)
_INV_LN2 = _bits(0x3FB8AA3B)
_ROUND_SHIFT = F(1.5 * 2.0**23)
_EXP_P1 = F(0xAAAA8F * 2.0**-26)
_EXP_P2 = F(-0xB55215 * 2.0**-32)
_ZERO, _HALF, _ONE, _TWO = F(0.0), F(0.5), F(1.0), F(2.0)


def _pow2(k: np.ndarray) -> np.ndarray:
    """2**k as float32 for integer k with k + 127 in [1, 254] (built from its bit pattern)."""
    return ((k + 127).astype(np.int32) << 23).view(np.float32)


def expf(x) -> np.ndarray:
    """The engine's ``expf`` over a float32 array, bit for bit (the same operations in the same
    order as deterministic/mathf.py's ``expf``, lanes instead of a scalar)."""
    x = np.asarray(x, np.float32)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        xc = np.where(x > EXP_UNDERFLOW, x, EXP_UNDERFLOW)  # nan goes to the low end, as in the kernel
        xc = np.where(xc < EXP_OVERFLOW, xc, EXP_OVERFLOW)
        kf = (xc * _INV_LN2 + _ROUND_SHIFT) - _ROUND_SHIFT
        hi = xc - kf * _LN2_HI
        lo = kf * _LN2_LO
        r = hi - lo
        t = r * r
        c = r - t * (_EXP_P1 + t * _EXP_P2)
        y = _ONE - ((lo - (r * c) / (_TWO - c)) - hi)
        k = kf.astype(np.int32)
        k1 = k >> 1
        scaled = (y * _pow2(k1)) * _pow2(k - k1)
        out = np.where(x < EXP_OVERFLOW, scaled, F(np.inf))
        out = np.where(x >= EXP_UNDERFLOW, out, _ZERO)
        out = np.where(x == x, out, x + x)
    return out.astype(np.float32)


# ---- logf: FreeBSD e_logf.c; its branches become selects over lanes -------------------------

_LOG_LN2_HI = _bits(0x3F317180)
_LOG_LN2_LO = _bits(0x3717F7D1)
_TWO25 = F(2.0**25)
_LG1 = F(0xAAAAAA * 2.0**-24)
_LG2 = F(0xCCCE13 * 2.0**-25)
_LG3 = F(0x91E9EE * 2.0**-25)
_LG4 = F(0xF89E26 * 2.0**-26)
_THIRD = F(1.0 / 3.0)


def logf(x) -> np.ndarray:
    """The engine's ``logf`` over a float32 array, bit for bit. Every branch of the scalar code
    is computed for every lane and the lane's own branch selected: a branch not taken only
    produces values that are thrown away (its floating-point warnings are silenced)."""
    x = np.asarray(x, np.float32)
    with np.errstate(all="ignore"):
        ix = x.view(np.int32).astype(np.int64)
        zero = (ix & 0x7FFFFFFF) == 0
        negative = (ix < 0) & ~zero
        subnormal = (ix < 0x00800000) & ~zero & ~negative
        k = np.where(subnormal, -25, 0)
        xs = np.where(subnormal, x * _TWO25, x)
        ix = np.where(subnormal, xs.view(np.int32).astype(np.int64), ix)
        special = ix >= 0x7F800000  # +inf or nan (after the subnormal scaling)
        k = k + (ix >> 23) - 127
        ix = ix & 0x007FFFFF
        i = (ix + (0x95F64 << 3)) & 0x800000
        xn = (ix | (i ^ 0x3F800000)).astype(np.int32).view(np.float32)
        k = k + (i >> 23)
        f = xn - _ONE
        dk = k.astype(np.float32)
        k0 = k == 0
        # -2**-9 <= f < 2**-9
        small = (0x007FFFFF & (0x8000 + ix)) < 0xC000
        small_zero = np.where(k0, _ZERO, dk * _LOG_LN2_HI + dk * _LOG_LN2_LO)
        r_small = (f * f) * (_HALF - _THIRD * f)
        small_value = np.where(k0, f - r_small, dk * _LOG_LN2_HI - ((r_small - dk * _LOG_LN2_LO) - f))
        small_value = np.where(f == _ZERO, small_zero, small_value)
        s = f / (_TWO + f)
        z = s * s
        i = ix - (0x6147A << 3)
        w = z * z
        j = (0x6B851 << 3) - ix
        t1 = w * (_LG2 + w * _LG4)
        t2 = z * (_LG1 + w * _LG3)
        i = i | j
        r = t2 + t1
        hfsq = (_HALF * f) * f
        wide = np.where(k0, f - (hfsq - s * (hfsq + r)),
                        dk * _LOG_LN2_HI - ((hfsq - (s * (hfsq + r) + dk * _LOG_LN2_LO)) - f))
        narrow = np.where(k0, f - s * (f - r), dk * _LOG_LN2_HI - ((s * (f - r) - dk * _LOG_LN2_LO) - f))
        out = np.where(small, small_value, np.where(i > 0, wide, narrow))
        out = np.where(special, xs + xs, out)
        out = np.where(negative, F(np.nan), out)
        out = np.where(zero, F(-np.inf), out)
    return out.astype(np.float32)


def sigmoidf(z) -> np.ndarray:
    """``1 / (1 + expf(-z))``, as deterministic/mathf.py's ``sigmoidf``."""
    return _ONE / (_ONE + expf(-np.asarray(z, np.float32)))


# ---- the fixed summation order (deterministic/reduction.py) -----------------------------------

K_CHUNK = 32
"""Terms folded sequentially before a partial sum enters the pairwise tree (a run-format constant)."""


def pairwise(partials: list) -> np.ndarray:
    """The pairwise tree over chunk sums (arrays), level by level, an odd last one carried up."""
    while len(partials) > 1:
        level = [partials[i] + partials[i + 1] for i in range(0, len(partials) - 1, 2)]
        if len(partials) % 2:
            level.append(partials[-1])
        partials = level
    return partials[0]


def fixed_sum(terms: np.ndarray) -> np.ndarray:
    """Sum over the *last* axis of float32 ``terms`` in the engine's order: chunks of
    :data:`K_CHUNK` folded from +0.0, then the pairwise tree; +0.0 for no terms. Each sum sees
    exactly its own operations; the chunks are lanes. The last chunk is padded with +0.0 terms,
    which changes no fold (a fold from +0.0 never holds -0.0, and s + 0.0 == s) and adds no chunk."""
    terms = np.asarray(terms, np.float32)
    n = terms.shape[-1]
    if n == 0:
        return np.zeros(terms.shape[:-1], np.float32)
    chunks = -(-n // K_CHUNK)
    padded = np.zeros((*terms.shape[:-1], chunks * K_CHUNK), np.float32)
    padded[..., :n] = terms
    lanes = padded.reshape(*terms.shape[:-1], chunks, K_CHUNK)
    s = np.zeros(lanes.shape[:-1], np.float32)
    for k in range(K_CHUNK):
        s = s + lanes[..., k]
    while s.shape[-1] > 1:  # the tree, level by level, an odd last one carried up
        m = s.shape[-1]
        level = s[..., 0 : m - 1 : 2] + s[..., 1:m:2]
        s = np.concatenate([level, s[..., m - 1 :]], axis=-1) if m % 2 else level
    return s[..., 0]
