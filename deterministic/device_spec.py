"""Parsing ``--device`` / ``device =``: kept apart from :mod:`.device` so that checking a
command line or a config file imports neither numba nor llvmlite."""

from __future__ import annotations

import re

from .errors import DeviceSpecError

_SPEC = re.compile(r"^(auto|cpu|cuda)(?::(\d{1,3}))?$")


def parse_device_spec(spec: str) -> tuple[str, int | None]:
    """``("auto" | "cpu" | "cuda", index or None)``; :class:`DeviceSpecError` for anything else."""
    match = _SPEC.match(spec.strip().lower()) if isinstance(spec, str) else None
    if match is None or (match.group(2) is not None and match.group(1) != "cuda"):
        raise DeviceSpecError(f"device must be auto, cpu, cuda or cuda:N, got {spec!r}")
    return match.group(1), None if match.group(2) is None else int(match.group(2))
