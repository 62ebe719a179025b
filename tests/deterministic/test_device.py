"""Device selection: spec parsing, the auto policy (first CUDA device that passes, else the CPU,
with a reason) and the refusal of a named device that is absent or fails the self-checks.

The policy tests stand a fake in for the CUDA devices (``probe_cuda_device``), because this
machine has none; the real probes on a CUDA backend run in ``test_cuda_sim`` (simulator) and
``bench/gpu_check.py`` (a GPU)."""

import pytest

from open1b.deterministic import device
from open1b.deterministic.device import DeviceProbe, cpu_device_class, cuda_device_count, select_device
from open1b.deterministic.device_spec import parse_device_spec
from open1b.deterministic.errors import DeviceSpecError, DeviceUnavailableError
from open1b.deterministic.selfcheck import CheckResult


@pytest.mark.parametrize("spec, parsed", [("auto", ("auto", None)), ("cpu", ("cpu", None)), ("cuda", ("cuda", None)),
                                          ("cuda:3", ("cuda", 3)), (" CUDA:0 ", ("cuda", 0))])  # fmt: skip
def test_parse_device_spec(spec, parsed):
    assert parse_device_spec(spec) == parsed


@pytest.mark.parametrize("spec", ["", "gpu", "cpu:0", "auto:1", "cuda:", "cuda:-1", "cuda:x", "cuda:1234", None, 0])
def test_malformed_specs_are_the_callers_mistake(spec):
    with pytest.raises(DeviceSpecError):
        parse_device_spec(spec)
    with pytest.raises(ValueError):
        select_device(spec)


def test_cpu_is_chosen_with_its_class_and_passed_checks():
    choice = select_device("cpu")
    assert (choice.kind, choice.index, choice.label, choice.device_class) == ("cpu", None, "cpu", cpu_device_class())
    assert choice.device_class.startswith("cpu/") and choice.checks and all(c.ok for c in choice.checks)


def test_auto_on_this_machine_says_which_device_and_why():
    count, why_none = cuda_device_count()
    choice = select_device("auto")
    if count == 0:  # this CI machine: no driver, so the CPU and the reason
        assert choice.kind == "cpu" and why_none in choice.reason and choice.reason.startswith("auto: ")
        with pytest.raises(DeviceUnavailableError, match="cuda:0 is not available"):
            select_device("cuda")
    else:
        assert choice.kind == "cuda" or "failed the self-checks" in choice.reason


def _fake_devices(monkeypatch, passing: dict[int, bool]):
    def probe(index):
        check = CheckResult("known-answer-step", passing[index], "state hash 0123…, expected c7df…")
        return DeviceProbe(index, "cuda/sm_90", (check,), backend=f"backend-{index}")

    monkeypatch.setattr(device, "cuda_device_count", lambda: (len(passing), "none"))
    monkeypatch.setattr(device, "probe_cuda_device", probe)


def test_auto_takes_the_first_cuda_device_that_passes(monkeypatch):
    _fake_devices(monkeypatch, {0: False, 1: True})
    choice = select_device("auto")
    assert (choice.kind, choice.label, choice.device_class, choice.cuda_backend) == ("cuda", "cuda:1", "cuda/sm_90",
                                                                                     "backend-1")  # fmt: skip
    assert choice.backend_for(None) == "backend-1"
    assert "cuda:1" in choice.reason


def test_auto_falls_back_to_the_cpu_and_names_the_failed_gpu(monkeypatch):
    _fake_devices(monkeypatch, {0: False})
    choice = select_device("auto")
    assert choice.kind == "cpu" and choice.device_class == cpu_device_class()
    assert "cuda:0 (cuda/sm_90) failed the self-checks: known-answer-step" in choice.reason


def test_a_named_gpu_that_fails_is_refused(monkeypatch):
    _fake_devices(monkeypatch, {0: False, 1: True})
    with pytest.raises(DeviceUnavailableError, match=r"cuda:0 \(cuda/sm_90\) is refused.*known-answer-step"):
        select_device("cuda:0")
    assert select_device("cuda:1").label == "cuda:1"
    with pytest.raises(DeviceUnavailableError, match="cuda:2 is not available: 2 CUDA device"):
        select_device("cuda:2")
