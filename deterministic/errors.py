"""Errors raised by the deterministic core.

They derive from the project's error root, :class:`open1b.protocol.errors.Open1bError`.
``DeterminismError`` means *this machine* cannot reproduce bits (not the caller's fault);
the ``ValueError`` subclasses mean the caller handed in something malformed.
"""

from __future__ import annotations

from ..protocol.errors import Open1bError


class DeterminismError(Open1bError):
    """This process cannot compute the reference bits (fusion, flush-to-zero, float64 promotion,
    or a known-answer step that came out different)."""


class ConfigError(Open1bError, ValueError):
    """A model configuration dict with unknown, missing or ill-typed keys."""


class StateFormatError(Open1bError, ValueError):
    """A set of tensors that is not a training state of the given configuration."""


class BatchFormatError(Open1bError, ValueError):
    """A batch whose dtype, shape or token range does not fit the configuration."""


class NonFiniteError(Open1bError, ArithmeticError):
    """A step whose loss or gradient norm is inf or nan: its state could not be reproduced (NaN
    payloads differ between machines), so the engine refuses to produce it."""


class RunFormatError(Open1bError):
    """A run directory, manifest or checkpoint that cannot be read or does not fit the run."""


class EngineMismatchError(Open1bError):
    """The run names another engine or version; this node declines it rather than approximate it."""


class CheckpointMismatchError(RunFormatError):
    """A checkpoint whose recomputed state hash differs from the manifest's h_k: not the published state."""


class SamplesFormatError(RunFormatError):
    """A samples file that is malformed, truncated, over-long, over the size bound, or holds a
    token outside its vocabulary (docs/run-format.md §4)."""


class SamplesMismatchError(RunFormatError):
    """A well-formed samples file, or a sample, that is not the one the run commits to (count,
    sample length, blob address or Merkle root differ)."""


class DistributedError(Open1bError):
    """A data-parallel training run that stopped because of its processes, not its data: a rank
    failed, died or did not answer within the timeout. ``rank`` is the rank to blame when one can
    be named (else None); ``detail`` is that rank's traceback as text, when it sent one."""

    def __init__(self, message: str, *, rank: int | None = None, detail: str = "") -> None:
        super().__init__(message)
        self.rank = rank
        self.detail = detail


class DeviceError(Open1bError):
    """A ``--device`` choice that cannot be honoured (see the two subclasses)."""


class DeviceSpecError(DeviceError, ValueError):
    """A device spec that is not ``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (the caller's mistake)."""


class DeviceUnavailableError(DeviceError):
    """An explicitly named device that this machine lacks, or that failed the self-checks (the
    machine's fault: it would compute other bits, so it is refused rather than used)."""


class TraceError(Open1bError):
    """A step that cannot be traced as run-format §11 defines its trace: an op input from no
    traced op, a device backend, a tensor that is not contiguous. A fault of the calling code."""
