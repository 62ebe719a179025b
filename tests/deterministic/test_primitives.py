"""The primitives: compiled = numpy emulation bit for bit (subnormals and specials included),
float32-only typing, and the engine-wide cache stamp."""

import hashlib
from pathlib import Path

import numpy as np
import pytest
from numba import njit
from numba.core.errors import TypingError

from open1b.deterministic import jit, norm
from fractions import Fraction

from open1b.deterministic.primitives import as_float32, as_int32, fadd, fdiv, ffma, fmul, fsqrt, fsub

F = np.float32
NOCACHE = {"error_model": "numpy", "cache": False}


@njit(**NOCACHE)
def binary_ops(a, b):
    out = np.empty((4, a.shape[0]), np.float32)
    for i in range(a.shape[0]):
        out[0, i], out[1, i] = fadd(a[i], b[i]), fsub(a[i], b[i])
        out[2, i], out[3, i] = fmul(a[i], b[i]), fdiv(a[i], b[i])
    return out


@njit(**NOCACHE)
def unary_ops(a):
    out = np.empty((2, a.shape[0]), np.float32)
    for i in range(a.shape[0]):
        out[0, i] = fsqrt(a[i])
        out[1, i] = as_float32(as_int32(a[i]) ^ 1)
    return out


def values(rng: np.random.Generator, n: int) -> np.ndarray:
    bits = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(F)  # every class of float
    special = np.array([0.0, -0.0, 1.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1.1754942e-38, 3.4e38], F)
    return np.concatenate([bits, special])


def test_compiled_primitives_equal_their_emulation_bitwise():
    rng = np.random.default_rng(0)
    a, b = values(rng, 20_000), values(rng, 20_000)[::-1].copy()
    with np.errstate(all="ignore"):
        emulated = np.array([[f(x, y) for x, y in zip(a, b)] for f in (fadd, fsub, fmul, fdiv)], F)
        emulated_unary = np.array([[fsqrt(x) for x in a], [as_float32(as_int32(x) ^ 1) for x in a]], F)
    got, got_unary = binary_ops(a, b), unary_ops(a)
    finite = ~np.isnan(emulated)  # NaN payloads are not part of the spec (the step refuses NaN)
    assert np.array_equal(np.isnan(got), ~finite)
    assert got.view(np.uint32)[finite].tobytes() == emulated.view(np.uint32)[finite].tobytes()
    finite = ~np.isnan(emulated_unary)
    assert got_unary.view(np.uint32)[finite].tobytes() == emulated_unary.view(np.uint32)[finite].tobytes()


@njit(**NOCACHE)
def fma_op(a, b, c):
    out = np.empty_like(a)
    for i in range(a.shape[0]):
        out[i] = ffma(a[i], b[i], c[i])
    return out


def fma_cases(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    a, b = rng.standard_normal(n).astype(F), rng.standard_normal(n).astype(F)
    # c near -a*b: cancellation, results on float32 midpoints, subnormal results
    near = (-(a.astype(np.float64) * b) * (1 + rng.integers(-4, 5, n) * 2.0**-24)).astype(F)
    c = np.where(np.arange(n) % 2 == 0, rng.standard_normal(n).astype(F) * F(1e-3), near).astype(F)
    return np.concatenate([a, F([1 + 2.0**-12, 1e-20, 3e38])]), np.concatenate([b, F([1 + 2.0**-12, 1e-20, 3e38])]), \
        np.concatenate([c, F([-(1 + 2.0**-11), 0.0, -3e38])])  # fmt: skip


def exact_fma(a, b, c) -> np.float32:
    """The float32 nearest to the exact a*b + c (ties to even), by exhaustive comparison."""
    x = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    if abs(x) >= Fraction(float(np.finfo(F).max)) + Fraction(2) ** 103:  # max + half an ulp rounds to inf
        return F(np.inf) if x > 0 else F(-np.inf)
    f = np.float32(float(x))
    candidates = [v for v in (np.nextafter(f, F(-np.inf)), f, np.nextafter(f, F(np.inf))) if np.isfinite(v)]
    return min(candidates, key=lambda v: (abs(Fraction(float(v)) - x), int(v.view(np.uint32)) & 1))


def test_ffma_rounds_once_compiled_and_emulated():
    a, b, c = fma_cases(np.random.default_rng(1), 4000)
    with np.errstate(over="ignore"):
        expected = np.array([exact_fma(x, y, z) for x, y, z in zip(a, b, c)], F)
    assert fma_op(a, b, c).tobytes() == expected.tobytes()  # vfmadd here; libm fmaf on a CPU without FMA
    assert ffma(a, b, c).tobytes() == expected.tobytes()  # the vectorised emulation
    assert ffma(F(1 + 2.0**-12), F(1 + 2.0**-12), F(-(1 + 2.0**-11))) == F(2.0**-24)  # the fusion probe, fused


def test_subnormals_survive_every_primitive():
    tiny = F(1e-45)  # the smallest subnormal
    assert binary_ops(np.array([tiny], F), np.array([F(1.0)], F))[:, 0].tolist() == [
        pytest.approx(1.0), -1.0, tiny, tiny]  # fmt: skip
    assert fsqrt(F(2.0**-148)) == F(2.0**-74)


@pytest.mark.parametrize("bad", [np.float64(2.0), 2.0, 2])
def test_float32_only(bad):
    @njit(**NOCACHE)
    def mixed(a, b):
        return fmul(a, b)

    with pytest.raises(TypingError):
        mixed(F(1.0), bad)


def test_engine_kernels_are_stamped_with_the_whole_package():
    digest = hashlib.blake2b(digest_size=16)
    root = Path(jit.__file__).parent
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    assert jit.SOURCE_DIGEST == digest.hexdigest()
    kernel = norm.KERNELS[False][0]
    assert kernel._cache._impl.locator.get_source_stamp() == jit.SOURCE_DIGEST

    @njit(cache=True)
    def outside(x):  # a function outside the package keeps numba's own per-file stamp
        return x

    assert outside._cache._impl.locator.get_source_stamp() != jit.SOURCE_DIGEST
