"""expf/logf: accuracy against float64, bit-identity with their numpy emulation, specials."""

import numpy as np
import pytest

from open1b.deterministic.mathf import expf, expf_array, logf, logf_array

F = np.float32


def ulp_error(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|got - ref| in float32 ulps of ref: ulp(r) = 2**(floor(log2|r|) - 23), at least 2**-149."""
    _, e = np.frexp(np.abs(ref))  # |ref| in [2**(e-1), 2**e)
    ulp = np.ldexp(1.0, np.maximum(e - 1 - 23, -149))
    return np.abs(got.astype(np.float64) - ref) / ulp


def dense_exp_inputs() -> np.ndarray:
    # 1e6 evenly spaced points over the range where expf is finite and nonzero, plus the
    # bit patterns around 0 (tiny arguments take a separate path).
    sweep = np.linspace(-103.9, 88.72, 1_000_000).astype(np.float32)
    tiny = np.linspace(0x2F000000, 0x3F000000, 50_000).astype(np.uint32).view(np.float32)
    return np.concatenate([sweep, tiny, -tiny])


def dense_log_inputs() -> np.ndarray:
    # 1e6 evenly spaced bit patterns over all positive finite floats (subnormals included),
    # plus a dense sweep around 1 where log is smallest relative to its inputs.
    bits = np.linspace(1, 0x7F7FFFFF, 1_000_000).astype(np.uint32).view(np.float32)
    near_one = np.linspace(0.9, 1.1, 200_000).astype(np.float32)
    return np.concatenate([bits, near_one])


def test_expf_max_error_below_one_ulp():
    x = dense_exp_inputs()
    err = ulp_error(expf_array(x), np.exp(x.astype(np.float64)))
    assert err.max() < 0.95, (err.max(), x[err.argmax()])  # measured 0.89


def test_logf_max_error_below_one_ulp():
    x = dense_log_inputs()
    err = ulp_error(logf_array(x), np.log(x.astype(np.float64)))
    assert err.max() < 0.9, (err.max(), x[err.argmax()])  # measured 0.82


def _sample(xs: np.ndarray, n: int) -> np.ndarray:
    idx = np.linspace(0, len(xs) - 1, n).astype(np.int64)
    return xs[idx]


@pytest.mark.parametrize("fn, fn_array, inputs", [(expf, expf_array, dense_exp_inputs), (logf, logf_array, dense_log_inputs)])
def test_compiled_equals_numpy_emulation_bitwise(fn, fn_array, inputs):
    # py_func runs the same source on np.float32 scalars: numpy rounds each op to float32.
    specials = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 1e-45, 88.72, 89.0, -87.5, -103.5, 3.4e38], np.float32)
    xs = np.concatenate([_sample(inputs(), 6000), specials])
    compiled = fn_array(xs)
    emulated = np.array([fn.py_func(x) for x in xs], dtype=np.float32)
    assert all(type(fn.py_func(x)) is np.float32 for x in xs[:50])
    assert compiled.view(np.uint32).tobytes() == emulated.view(np.uint32).tobytes()


def test_special_values():
    assert np.isnan(expf(F(np.nan))) and np.isnan(logf(F(np.nan)))
    assert expf(F(np.inf)) == np.inf and expf(F(-np.inf)) == 0
    assert expf(F(89.0)) == np.inf and expf(F(-104.0)) == 0
    assert expf(F(0.0)) == 1
    assert 0 < expf(F(-100.0)) < np.finfo(np.float32).smallest_normal  # gradual underflow kept
    assert logf(F(0.0)) == -np.inf and logf(F(-0.0)) == -np.inf
    assert np.isnan(logf(F(-1.0))) and logf(F(np.inf)) == np.inf
    assert logf(F(1.0)) == 0
    assert logf(F(2.0**-149)) == F(-149 * np.log(2.0))  # smallest subnormal; correctly rounded here


def test_return_float32_inside_compiled_code():
    from numba import types

    expf(F(1.0)), logf(F(1.0))
    for fn in (expf, logf):
        sig = [s for s in fn.nopython_signatures if tuple(s.args) == (types.float32,)][0]
        assert sig.return_type == types.float32
    assert expf_array(np.ones(3, F)).dtype == F and logf_array(np.ones(3, F)).dtype == F
