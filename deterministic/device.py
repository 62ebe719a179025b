"""Which device a process computes on, chosen once (``--device``), and its device class.

:func:`select_device` turns a spec — ``auto``, ``cpu``, ``cuda`` or ``cuda:N`` — into a
:class:`DeviceChoice`: a device that passed every self-check of :mod:`.selfcheck` *on that
device* (the fusion, subnormal and transcendental probes run by its own kernels, and the
known-answer step, whose state hash must be the CPU's pinned one), its class and a one-line
reason for the choice. ``auto`` takes the first CUDA device that passes, else the CPU, and says
why; a named device that is absent or fails is refused with :class:`.errors.DeviceUnavailableError`
(the caller decides whether to fall back). A CUDA choice creates the device's context in the
calling process and thread: call it in the process that will replay (the replay worker), never
in a process that must stay free of CUDA.

Device classes are the short, spec-defined names an attestation carries (docs/protocol.md, the
attestation's ``device`` field), so coverage can show which kinds of device agree on a step.
The class names the target the kernels were compiled for, not the exact model:
``cpu/x86_64-avx512``, ``cpu/x86_64-avx2``, ``cpu/aarch64-neon``, ``cuda/sm_90``. It never
changes the bits (the engine's order is per output, whatever the target); it says which
independent code paths have agreed.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass

import llvmlite.binding as llvm

from .device_spec import parse_device_spec
from .errors import DeviceUnavailableError
from .selfcheck import CheckResult, run_selfchecks



def cpu_device_class() -> str:
    """The class of this process's CPU target, from the features numba compiles for."""
    machine = platform.machine().lower()
    features = {name for name, on in llvm.get_host_cpu_features().items() if on}
    if machine in ("x86_64", "amd64"):
        level = "avx512" if "avx512f" in features else "avx2" if {"avx2", "fma"} <= features else "sse"
        return f"cpu/x86_64-{level}"
    if machine in ("aarch64", "arm64"):
        return "cpu/aarch64-sve" if "sve" in features else "cpu/aarch64-neon"
    return f"cpu/{machine or 'unknown'}"


def cuda_device_class(compute_capability: tuple[int, int]) -> str:
    """The class of a CUDA device with ``compute_capability`` (major, minor), e.g. ``cuda/sm_90``."""
    major, minor = compute_capability
    return f"cuda/sm_{major}{minor}"


@dataclass(frozen=True)
class DeviceProbe:
    """One CUDA device and its self-check results (``ok``: every check passed)."""

    index: int
    device_class: str
    checks: tuple[CheckResult, ...]
    backend: object  # the device's CudaBackend (its context is current in the probing thread)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def failures(self) -> str:
        return "; ".join(f"{c.name}: {c.detail}" for c in self.checks if not c.ok)


@dataclass(frozen=True)
class DeviceChoice:
    """A device that passed the self-checks: ``kind`` ``"cpu"`` or ``"cuda"``, ``index`` (CUDA
    only), its :attr:`device_class`, the one-line ``reason`` it was chosen and the ``checks`` it
    passed. :meth:`backend_for` gives the backend a model's steps run on."""

    kind: str
    index: int | None
    device_class: str
    reason: str
    checks: tuple[CheckResult, ...]
    cuda_backend: object | None = None

    @property
    def label(self) -> str:
        """``cpu`` or ``cuda:N``."""
        return "cpu" if self.kind == "cpu" else f"cuda:{self.index}"

    def backend_for(self, config):
        """The backend that runs ``config``'s steps here (on the CPU: serial or parallel by
        model size, :func:`.backend.default_backend`; the bits are the same either way)."""
        if self.cuda_backend is not None:
            return self.cuda_backend
        from .backend import default_backend

        return default_backend(config)


def cuda_device_count() -> tuple[int, str]:
    """``(number of usable CUDA devices, why none)``: the count is 0 with a reason when numba-cuda,
    the driver or a device is missing. Creates no context."""
    try:
        from numba import cuda
    except ImportError as exc:  # numba-cuda is an optional dependency of a CPU-only install
        return 0, f"numba-cuda is not installed ({exc})"
    if not cuda.is_available():
        return 0, "no CUDA driver or device is usable in this process"
    return len(cuda.gpus), "no CUDA device is listed"


def probe_cuda_device(index: int) -> DeviceProbe:
    """Make CUDA device ``index`` current in this thread and run every self-check on it."""
    from .cuda import CudaBackend

    backend = CudaBackend(index)
    return DeviceProbe(index, cuda_device_class(backend.compute_capability), tuple(run_selfchecks(backend)), backend)


def cpu_choice(reason: str) -> DeviceChoice:
    """The CPU, after its own self-checks (:class:`DeviceUnavailableError` if they fail: there is
    nothing left to fall back to)."""
    checks = tuple(run_selfchecks())
    failed = "; ".join(f"{c.name}: {c.detail}" for c in checks if not c.ok)
    if failed:
        raise DeviceUnavailableError(f"the CPU fails the self-checks: {failed}")
    return DeviceChoice("cpu", None, cpu_device_class(), reason, checks)


def _cuda_choice(probe: DeviceProbe, reason: str) -> DeviceChoice:
    return DeviceChoice("cuda", probe.index, probe.device_class, reason, probe.checks, probe.backend)


def select_device(spec: str = "auto") -> DeviceChoice:
    """The device ``spec`` names, self-checked (see the module doc).

    * ``cpu``: the CPU.
    * ``cuda`` / ``cuda:N``: CUDA device 0 / N, or :class:`DeviceUnavailableError` when it is
      absent or fails a self-check (the message names every failed check).
    * ``auto``: the first CUDA device that passes, else the CPU; ``reason`` says which devices
      were tried and why each was passed over.

    :class:`DeviceSpecError` for a malformed spec. Slow the first time in a process (the
    kernels compile or load from the cache, and the known-answer step runs).
    """
    kind, index = parse_device_spec(spec)
    if kind == "cpu":
        return cpu_choice("cpu requested")
    count, why_none = cuda_device_count()
    if kind == "cuda":
        index = index or 0
        if index >= count:
            raise DeviceUnavailableError(f"cuda:{index} is not available: "
                                         + (f"{count} CUDA device(s) here" if count else why_none))
        probe = probe_cuda_device(index)
        if not probe.ok:
            raise DeviceUnavailableError(f"cuda:{index} ({probe.device_class}) is refused: it would compute other "
                                         f"bits ({probe.failures()})")
        return _cuda_choice(probe, f"cuda:{index} requested and passed the self-checks")
    passed_over = []
    for i in range(count):
        probe = probe_cuda_device(i)
        if probe.ok:
            return _cuda_choice(probe, f"auto: cuda:{i} ({probe.device_class}) passed the self-checks")
        passed_over.append(f"cuda:{i} ({probe.device_class}) failed the self-checks: {probe.failures()}")
    return cpu_choice("auto: " + ("; ".join(passed_over) if passed_over else why_none) + "; using the CPU")


def select_device_or_cpu(spec: str = "auto") -> DeviceChoice:
    """:func:`select_device`, except that a named GPU that is missing or fails a self-check gives
    the CPU, with the refusal in ``reason``, instead of an error: what a node or a CLI does, since
    the CPU computes the same bits. :class:`DeviceSpecError` for a malformed spec;
    :class:`DeviceUnavailableError` only when the CPU itself fails the self-checks."""
    try:
        return select_device(spec)
    except DeviceUnavailableError as exc:
        if parse_device_spec(spec)[0] == "cpu":
            raise
        return cpu_choice(f"{exc}; using the CPU")
