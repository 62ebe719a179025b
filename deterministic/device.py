"""Device classes: the short, spec-defined name of the kind of machine that replayed a step.

An attestation carries one (docs/protocol.md, the attestation's ``device`` field), so coverage can
show which kinds of device agree on a step. The class names the target the kernels were compiled
for, not the exact model: ``cpu/x86_64-avx512``, ``cpu/x86_64-avx2``, ``cpu/aarch64-neon``,
``cuda/sm_90``. It never changes the bits (the engine's order is per output, whatever the target);
it says which independent code paths have agreed.
"""

from __future__ import annotations

import platform

import llvmlite.binding as llvm


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
