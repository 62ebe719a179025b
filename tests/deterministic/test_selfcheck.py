"""Start-up probes pass here, each can fail, and the known-answer step pins the whole spec."""

import importlib
import pkgutil

import numpy as np
import pytest
import torch
from numba import njit
from numba.core.dispatcher import Dispatcher

from open1b.deterministic import DeterminismError, require_deterministic_machine, run_selfchecks
from open1b.deterministic.backend import cpu_backend
from open1b.deterministic.probes import FUSION_A, FUSION_C, PROBE_INPUTS, probe_cpu
from open1b.deterministic.selfcheck import KNOWN_ANSWER_STATE, known_answer_state, state_fingerprint

F = np.float32
NAMES = {"no-fma-contraction", "gradual-underflow", "float32-arithmetic", "expf-logf-known-answers", "known-answer-step"}


def test_all_probes_pass_on_this_machine_for_both_cpu_backends():
    for parallel in (False, True):
        results = run_selfchecks(cpu_backend(parallel))
        assert {r.name for r in results} == NAMES
        assert all(r.ok for r in results), results
        require_deterministic_machine(cpu_backend(parallel))


def test_known_answer_state_is_the_pinned_test_vector():
    # The pinned hash covers init, the kernels' orders, the rank/micro-batch reduction, clipping
    # and AdamW: any change to the spec must change it (and the engine version) deliberately.
    assert state_fingerprint(known_answer_state()) == KNOWN_ANSWER_STATE


def test_fusion_probe_values_detect_contraction():
    @njit(fastmath={"contract"})
    def fused(a, b, c):
        return a * b + c

    assert F(fused(FUSION_A, FUSION_A, FUSION_C)) == F(2.0**-24)  # what a fused multiply-add gives
    assert F(probe_cpu(PROBE_INPUTS)[0]) == F(0.0)  # what the engine's primitives give


def test_no_engine_kernel_is_compiled_with_fastmath():
    import open1b.deterministic as package

    dispatchers = []
    for info in pkgutil.iter_modules(package.__path__):
        if info.name in ("cuda", "torch_twin"):
            continue
        module = importlib.import_module(f"open1b.deterministic.{info.name}")
        for value in vars(module).values():
            kernels = value.values() if isinstance(value, dict) else [value]
            for k in kernels:
                for d in k if isinstance(k, tuple) else [k]:
                    if isinstance(d, Dispatcher):
                        dispatchers.append(d)
    assert len(dispatchers) >= 20
    assert all(not d.targetoptions.get("fastmath") and d.targetoptions.get("error_model") == "numpy" for d in dispatchers)


def test_promotion_probe_values_detect_float64():
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
    assert "gradual-underflow" in failed
    require_deterministic_machine()


class BlasMatmul:
    """The CPU backend with numpy's (BLAS) matmul for every product: right to ~1e-7, but other bits."""

    def __init__(self):
        self.inner = cpu_backend(False, fused=False)  # unfused: no product bypasses this matmul

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def matmul(self, a, b, trans_a=False, trans_b=False, structure=0):
        a = np.swapaxes(a, -1, -2) if trans_a else a
        b = np.swapaxes(b, -1, -2) if trans_b else b
        return np.ascontiguousarray(np.matmul(a, b), dtype=np.float32)


def test_known_answer_step_refuses_a_backend_with_other_bits():
    failed = {r.name for r in run_selfchecks(BlasMatmul()) if not r.ok}
    assert failed == {"known-answer-step"}
    with pytest.raises(DeterminismError, match="known-answer-step"):
        require_deterministic_machine(BlasMatmul())


class FusingDevice:
    """The CPU backend as a device that contracts a*b + c into an fma and flushes subnormal
    results (what numba-cuda without the engine's ``.rn`` bindings, or ``-ftz``, would do)."""

    def __init__(self):
        self.inner = cpu_backend(False)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def probe(self, x):
        out = self.inner.probe(x)
        out[0] = np.float32(np.float64(x[0]) * np.float64(x[1]) + np.float64(x[2]))  # one rounding: fused
        out[1] = np.float32(0.0)  # flushed
        return out


def test_probes_run_on_the_given_backend_and_refuse_a_fusing_flushing_device():
    results = {r.name: r for r in run_selfchecks(FusingDevice())}
    assert {n for n, r in results.items() if not r.ok} == {"no-fma-contraction", "gradual-underflow"}
    assert "2**-24" in results["no-fma-contraction"].detail or "5.96" in results["no-fma-contraction"].detail
    with pytest.raises(DeterminismError, match="no-fma-contraction.*gradual-underflow"):
        require_deterministic_machine(FusingDevice())
