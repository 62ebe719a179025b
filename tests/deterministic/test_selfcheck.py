"""Start-up probes pass here, and each can fail."""

import numpy as np
import pytest
import torch
from numba import njit

from open1b.deterministic import DeterminismError, require_deterministic_machine, run_selfchecks
from open1b.deterministic.selfcheck import FUSION_A, FUSION_C

F = np.float32


def test_all_probes_pass_on_this_machine():
    results = run_selfchecks()
    assert {r.name for r in results} == {"no-fma-contraction", "gradual-underflow", "float32-arithmetic", "expf-logf-known-answers"}
    assert all(r.ok for r in results), results
    require_deterministic_machine()


def test_fusion_probe_detects_contraction():
    @njit(fastmath={"contract"})
    def fused(a, b, c):
        return a * b + c

    assert F(fused(FUSION_A, FUSION_A, FUSION_C)) == F(2.0**-24)


def test_promotion_probe_detects_float64():
    @njit
    def promoted(a, b):
        return (np.float64(a) + b) - a

    assert promoted(F(1.0), F(2.0**-30)) == 2.0**-30


def test_flush_to_zero_is_refused():
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals")
    try:
        failed = {r.name for r in run_selfchecks() if not r.ok}
        with pytest.raises(DeterminismError, match="gradual-underflow"):
            require_deterministic_machine()
    finally:
        torch.set_flush_denormal(False)
    assert failed == {"gradual-underflow"}
    require_deterministic_machine()
