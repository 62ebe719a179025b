"""expf/logf/sigmoidf: accuracy against float64, compiled = numpy emulation bit for bit, specials,
and expf's loop vectorising (it is branch-free) without changing bits."""

import numpy as np
import pytest
from numba import njit, types

from open1b.deterministic.mathf import EXP_OVERFLOW, EXP_UNDERFLOW, expf, logf, sigmoidf

F = np.float32
# cache=False: a cached test kernel would not notice a change to mathf.py (numba stamps the cache
# with the file holding the kernel only; the engine's own kernels are stamped with the package).
NOCACHE = {"error_model": "numpy", "cache": False}


@njit(**NOCACHE)
def expf_array(x):
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        out[i] = expf(x[i])
    return out


@njit(**NOCACHE)
def logf_array(x):
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        out[i] = logf(x[i])
    return out


@njit(**NOCACHE)
def sigmoidf_array(x):
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        out[i] = sigmoidf(x[i])
    return out


@njit(**NOCACHE)
def expf_scalar_loop(x):
    # The same loop with a data-dependent early exit, which keeps LLVM from vectorising it.
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        if x[i] == F(12345.0):
            break
        out[i] = expf(x[i])
    return out


def ulp_error(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|got - ref| in float32 ulps of ref: ulp(r) = 2**(floor(log2|r|) - 23), at least 2**-149."""
    _, e = np.frexp(np.abs(ref))
    ulp = np.ldexp(1.0, np.maximum(e - 1 - 23, -149))
    return np.abs(got.astype(np.float64) - ref) / ulp


def every_nth_float(lo: float, hi: float, step: int) -> np.ndarray:
    """Every ``step``-th float32 bit pattern in [lo, hi] (both signs walked in bit order)."""
    bits = np.arange(0, 2**32, step, dtype=np.uint64).astype(np.uint32).view(F)
    return bits[np.isfinite(bits) & (bits >= F(lo)) & (bits <= F(hi))]


def test_expf_max_error_below_one_ulp():
    # Every 101st float32 in the range where expf is finite and nonzero (~2e7 values; subnormal
    # results included), plus a dense sweep.
    x = np.concatenate([every_nth_float(-103.97, 88.72, 101), np.linspace(-103.97, 88.72, 1_000_000, dtype=F)])
    err = ulp_error(expf_array(x), np.exp(x.astype(np.float64)))
    assert err.max() < 0.9, (err.max(), x[err.argmax()])  # measured 0.897 (every 7th float)


def test_logf_max_error_below_one_ulp():
    x = np.concatenate([every_nth_float(0.0, np.finfo(F).max, 101), np.linspace(0.9, 1.1, 200_000, dtype=F)])
    x = x[x > 0]
    err = ulp_error(logf_array(x), np.log(x.astype(np.float64)))
    assert err.max() < 0.9, (err.max(), x[err.argmax()])  # measured 0.867 (every 13th float)


def test_sigmoidf_close_to_float64():
    x = np.linspace(-100, 100, 200_001, dtype=F)
    ref = 1 / (1 + np.exp(-x.astype(np.float64)))
    assert np.abs(sigmoidf_array(x) - ref).max() < 2e-7


def specials() -> np.ndarray:
    return np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 88.72, EXP_OVERFLOW,
                     np.nextafter(EXP_OVERFLOW, F(0)), 89.0, -87.5, -103.5, EXP_UNDERFLOW,
                     np.nextafter(EXP_UNDERFLOW, F(0)), -104.0, 3.4e38, -3.4e38, 2.0**-14, -(2.0**-14)], F)  # fmt: skip


@pytest.mark.parametrize("fn, compiled", [(expf, expf_array), (logf, logf_array), (sigmoidf, sigmoidf_array)])
def test_compiled_equals_numpy_emulation_bitwise(fn, compiled):
    # Run as Python, the function is its own numpy-float32 emulation (primitives round each op).
    rng = np.random.default_rng(0)
    xs = np.concatenate([rng.uniform(-110, 100, 3000).astype(F), rng.standard_normal(3000).astype(F), specials()])
    if fn is logf:
        xs = np.concatenate([np.abs(xs), specials()])
    with np.errstate(all="ignore"):
        emulated = np.array([fn(x) for x in xs], dtype=F)
        assert all(type(fn(x)) is np.float32 for x in xs)
    assert compiled(xs).view(np.uint32).tobytes() == emulated.view(np.uint32).tobytes()


def test_vectorised_expf_equals_scalar_expf():
    x = np.linspace(-110, 95, 100_003, dtype=F)
    assert expf_array(x).tobytes() == expf_scalar_loop(x).tobytes()


def test_special_values():
    assert np.isnan(expf_array(np.array([np.nan], F))[0]) and np.isnan(logf(F(np.nan)))
    e = expf_array(np.array([np.inf, -np.inf, EXP_OVERFLOW, 89.0, -104.0, 0.0, -100.0], F))
    assert e[0] == np.inf and e[1] == 0 and e[2] == np.inf and e[3] == np.inf and e[4] == 0 and e[5] == 1
    assert 0 < e[6] < np.finfo(F).smallest_normal  # gradual underflow kept
    below = expf_array(np.array([np.nextafter(EXP_OVERFLOW, F(0))], F))[0]
    assert np.isfinite(below) and below > F(3.4e38)
    lg = logf_array(np.array([0.0, -0.0, -1.0, np.inf, 1.0, 2.0**-149], F))
    assert lg[0] == -np.inf and lg[1] == -np.inf and np.isnan(lg[2]) and lg[3] == np.inf and lg[4] == 0
    assert lg[5] == F(-149 * np.log(2.0))  # smallest subnormal; correctly rounded here


def test_return_float32_inside_compiled_code():
    @njit(**NOCACHE)
    def probe(x):
        return expf(x), logf(x), sigmoidf(x)

    probe(F(1.0))
    assert probe.nopython_signatures[0].return_type == types.UniTuple(types.float32, 3)
