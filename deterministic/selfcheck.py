"""Start-up probes: does *this process* compute float32 the way the spec requires?

Each probe runs a tiny compiled kernel whose exact answer is known and differs when the
process misbehaves. They catch the three failures seen in practice:

* **fusion** — ``a*b + c`` contracted into one fma (rounds once instead of twice);
* **flush-to-zero** — subnormal results replaced by zero (e.g. after
  ``torch.set_flush_denormal(True)``, or on hardware that flushes);
* **float64 promotion** — intermediate results computed in double precision.

A machine that passes computes the reference bits for the kernels of this package;
:func:`require_deterministic_machine` raises :class:`.errors.DeterminismError` otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from .errors import DeterminismError
from .layers import linear_forward
from .mathf import expf, logf

_F = np.float32
FUSION_A = _F(1 + 2.0**-12)
FUSION_C = _F(-(1 + 2.0**-11))
"""``a*a + c``: a*a = 1 + 2**-11 + 2**-24 rounds to 1 + 2**-11, so the unfused result is 0;
a fused multiply-add keeps the 2**-24."""


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    detail: str


@njit(cache=True, error_model="numpy")
def fusion_probe(a, b, c):
    return a * b + c


@njit(cache=True, error_model="numpy")
def subnormal_probe(a, b):
    return a * b


@njit(cache=True, error_model="numpy")
def promotion_probe(a, b):
    # (a + b) - a: 0 in float32 for a = 1, b = 2**-30; 2**-30 if computed in float64.
    return (a + b) - a


def _check_fusion() -> CheckResult:
    got = _F(fusion_probe(FUSION_A, FUSION_A, FUSION_C))
    return CheckResult("no-fma-contraction", bool(got == 0), f"a*b+c = {float(got)!r}, expected 0.0 (fused gives 2**-24)")


def _check_subnormals() -> CheckResult:
    got = _F(subnormal_probe(_F(1e-38), _F(1e-3)))
    ref = _F(1e-38) * _F(1e-3)  # numpy scalar arithmetic in this thread; should be subnormal too
    ok = got != 0 and got == ref and 0 < got < np.finfo(np.float32).smallest_normal
    return CheckResult("gradual-underflow", bool(ok), f"1e-38 * 1e-3 = {float(got)!r}, expected subnormal {float(ref)!r}")


def _float32_return_type(dispatcher) -> str:
    from numba import types

    dispatcher(_F(1.0))  # make sure the float32 specialisation exists
    for sig in dispatcher.nopython_signatures:
        if tuple(sig.args) == (types.float32,):
            return str(sig.return_type)
    return "missing"


def _check_promotion() -> CheckResult:
    got = _F(promotion_probe(_F(1.0), _F(2.0**-30)))
    x = np.ones((1, 2), np.float32)
    w = np.ones((2, 1), np.float32)
    b = np.zeros(1, np.float32)
    dtypes = {
        "linear_forward": str(linear_forward(x, w, b).dtype),
        "expf": _float32_return_type(expf),
        "logf": _float32_return_type(logf),
    }
    ok = got == 0 and all(t == "float32" for t in dtypes.values())
    return CheckResult("float32-arithmetic", bool(ok), f"(1 + 2**-30) - 1 = {float(got)!r} (expected 0.0); dtypes {dtypes}")


def _check_transcendentals() -> CheckResult:
    # Known answers, pinned bit patterns of the spec'd algorithms.
    e1 = int(np.float32(expf(_F(1.0))).view(np.uint32))
    l3 = int(np.float32(logf(_F(3.0))).view(np.uint32))
    ok = e1 == 0x402DF854 and l3 == 0x3F8C9F54
    return CheckResult("expf-logf-known-answers", ok, f"expf(1) = {e1:#010x}, logf(3) = {l3:#010x}")


def run_selfchecks() -> list[CheckResult]:
    """Run every probe in this thread and return their results (never raises on failure)."""
    return [_check_fusion(), _check_subnormals(), _check_transcendentals(), _check_promotion()]


def require_deterministic_machine() -> None:
    """Raise :class:`DeterminismError` naming every failed probe, else return None."""
    failed = [c for c in run_selfchecks() if not c.ok]
    if failed:
        lines = "; ".join(f"{c.name}: {c.detail}" for c in failed)
        raise DeterminismError(f"this process cannot reproduce open1b float32 bits: {lines}")
