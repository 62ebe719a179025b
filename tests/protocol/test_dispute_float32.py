"""The referee's numpy float32 primitives against the engine's compiled ones, bit for bit: the
fused multiply-add on the cases where a float64 shortcut rounds twice, and the software expf/logf
over sweeps of every class of float32 input."""

import numpy as np
from numba import njit

from open1b.deterministic.mathf import expf as kernel_expf, logf as kernel_logf
from open1b.deterministic.primitives import ffma as kernel_ffma
from open1b.protocol.dispute.float32 import expf, ffma, fixed_sum, logf

F = np.float32
NOCACHE = {"error_model": "numpy", "cache": False}


@njit(**NOCACHE)
def _hw_fma(a, b, c):
    out = np.empty_like(a)
    for i in range(a.shape[0]):
        out[i] = kernel_ffma(a[i], b[i], c[i])  # llvm.fma.f32: one rounding, in hardware
    return out


@njit(**NOCACHE)
def _hw_exp_log(x):
    out = np.empty((2, x.shape[0]), np.float32)
    for i in range(x.shape[0]):
        out[0, i] = kernel_expf(x[i])
        out[1, i] = kernel_logf(x[i])
    return out


def _double_rounding_cases(rng, n):
    """a*b + c one hair off a float32 midpoint: the float64 sum rounds *onto* the midpoint, and a
    float64 fma cast to float32 then breaks the false tie to even, wrong whenever the exact
    value's side is not the even one. With lo a float32, hi its upper neighbour, h half their
    distance and a = 1 + v·2**-k, b = h·(1 - v·2**-k) (both exact in float32), a*b = h - h·v²·2**-2k
    with h·v²·2**-2k below half a float64 ulp of lo: so lo + a*b sits just below the midpoint
    (the right answer is lo), and hi - a*b just above it (the right answer is hi)."""
    lo = (rng.uniform(1, 2, n) * 2.0 ** rng.integers(-100, 100, n)).astype(F)
    hi = np.nextafter(lo, F(np.inf))
    h = ((hi.astype(np.float64) - lo) / 2).astype(F)
    k = rng.integers(15, 24, n)
    v = np.floor(rng.uniform(1, 2.0 ** (k - 15) + 1)).astype(np.float64)
    a = (1 + v * 2.0**-k).astype(F)
    b = (h * (1 - v * 2.0**-k)).astype(F)
    below = rng.integers(0, 2, n).astype(bool)
    return np.where(below, a, -a).astype(F), b, np.where(below, lo, hi).astype(F)


def _special_cases():
    vals = F([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1.17549435e-38, 3.4028235e38,
              -3.4028235e38, 1 + 2.0**-12, -(1 + 2.0**-11), 2.0**-75, 1.5, 2.0**64])
    a, b, c = np.meshgrid(vals, vals, vals, indexing="ij")
    return a.reshape(-1), b.reshape(-1), c.reshape(-1)


def _bits_equal(x, y):
    nan = np.isnan(x)
    return np.array_equal(nan, np.isnan(y)) and x[~nan].tobytes() == y[~nan].tobytes()


def test_ffma_equals_the_hardware_fma_where_float64_rounds_twice():
    rng = np.random.default_rng(7)
    a, b, c = _double_rounding_cases(rng, 200_000)
    naive = (a.astype(np.float64) * b + c).astype(F)
    want = _hw_fma(a, b, c)
    assert (naive != want).sum() > 1000  # the cases are hard: a float64 fma gets these wrong
    assert ffma(a, b, c).tobytes() == want.tobytes()
    for sign in (-1, 1):  # the same on the negative side and at the other rounding direction
        assert ffma(F(sign) * a, b, F(sign) * c).tobytes() == _hw_fma(F(sign) * a, b, F(sign) * c).tobytes()


def test_ffma_on_random_near_cancelling_and_special_operands():
    rng = np.random.default_rng(8)
    n = 200_000
    a, b = rng.standard_normal(n).astype(F), rng.standard_normal(n).astype(F)
    near = (-(a.astype(np.float64) * b) * (1 + rng.integers(-4, 5, n) * 2.0**-24)).astype(F)
    bits = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(F)  # every class of float
    for x, y, z in ((a, b, near), (bits, bits[::-1].copy(), np.roll(bits, 1)), _special_cases()):
        with np.errstate(all="ignore"):
            assert _bits_equal(ffma(x, y, z), _hw_fma(x, y, z))
    # overflow boundary: max + half an ulp rounds to inf, anything below it to max
    big, half_ulp = F(3.4028235e38), F(2.0**103)
    for c in (half_ulp, np.nextafter(half_ulp, F(0)), np.nextafter(half_ulp, F(np.inf))):
        x, y, z = F([big, -big]), F([1, 1]), F([c, -c])
        assert ffma(x, y, z).tobytes() == _hw_fma(x, y, z).tobytes()


def test_expf_and_logf_equal_the_kernels_over_a_sweep_of_all_float32_classes():
    # every 509th bit pattern (8.4 million inputs: normals, subnormals, zeros, infs, nans of both signs)
    x = np.arange(0, 2**32, 509, dtype=np.uint64).astype(np.uint32).view(F)
    x = np.concatenate([x, F([0.0, -0.0, np.inf, -np.inf, np.nan, 88.72284, -103.97208, 1e-45, 1.0])])
    want = _hw_exp_log(x)
    assert _bits_equal(expf(x), want[0])
    assert _bits_equal(logf(x), want[1])


def test_fixed_sum_is_the_chunked_pairwise_order():
    rng = np.random.default_rng(9)
    from open1b.deterministic.reduction import fixed_sum as kernel_fixed_sum
    for n in (0, 1, 31, 32, 33, 100, 1000, 4097):
        t = (rng.standard_normal((5, n)) * 10.0 ** rng.integers(-3, 4, (5, n))).astype(F)
        t[:, ::5] = -0.0  # signed zeros: the padding must not turn a sum's sign
        t[1] = -0.0
        if n > 2:
            t[2, 1], t[3, 2], t[4, 0] = np.inf, np.nan, -np.inf
        assert _bits_equal(fixed_sum(t), kernel_fixed_sum(t.T))
