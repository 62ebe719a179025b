"""What a devnet is asked to do (:class:`DevnetOptions`) and the scenarios it knows."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from open1b.deterministic import PRESETS
from open1b.deterministic.device_spec import parse_device_spec
from open1b.deterministic.trainer import DEFAULT_PRESET
from open1b.protocol import Open1bError

EVAL_DOCUMENTS = 8  # documents a devnet run with an evaluation schedule holds out (docs/run-format.md §9.1)
# Faults and adversaries a devnet can inject (node/scenarios.py; docs/reliability.md).
SCENARIOS = ("tampered-step", "lying-auditor", "copying-auditor", "forged-and-malformed", "sybil", "crash",
             "partition", "late-joiner", "forged-data", "skipped-update", "forged-microbatch", "refusing-trainer", "nat",
             "forged-op", "false-accusation", "straggler", "device-classes", "silent-disputant", "oversized-disputant")


class DevnetError(Open1bError):
    """The devnet could not be brought up or torn down."""


MAX_NODES = 32
MAX_STEPS = 1024
MAX_DEADLINE_S = 24 * 3600.0


@dataclass(frozen=True)
class DevnetOptions:
    nodes: int = 3
    steps: int = 8
    redundancy: int = 1
    tamper_step: int | None = None
    eval_every: int = 0  # > 0: hold out EVAL_DOCUMENTS documents and evaluate every eval_every-th state
    tamper_eval: int | None = None  # the trainer's published loss for this state is false (one bit flipped)
    deadline_s: float = 150.0
    seed: int = 0
    workdir: Path | None = None
    keep: bool = False
    scenarios: tuple[str, ...] = ()
    device: str = "auto"  # where the trainer and every daemon's replay worker compute (``--device``)
    preset: str = DEFAULT_PRESET  # the model the run trains (the scenarios train the default one)

    def __post_init__(self) -> None:
        unknown = set(self.scenarios) - set(SCENARIOS)
        if unknown:
            raise ValueError(f"unknown scenario(s) {sorted(unknown)}; known: {', '.join(SCENARIOS)}")
        if self.nodes < 1 or self.steps < 1 or self.redundancy < 1:
            raise ValueError("nodes, steps and redundancy must be at least 1")
        if self.nodes > MAX_NODES or self.steps > MAX_STEPS:  # a local devnet: processes and training here
            raise ValueError(f"a devnet has at most {MAX_NODES} nodes and {MAX_STEPS} steps")
        if not 0 < self.deadline_s <= MAX_DEADLINE_S:
            raise ValueError(f"--deadline must be in (0, {MAX_DEADLINE_S:.0f}] seconds")
        if self.redundancy > self.nodes:
            raise ValueError(f"redundancy {self.redundancy} needs at least that many nodes (got {self.nodes})")
        parse_device_spec(self.device)  # DeviceSpecError (a ValueError) before anything starts
        if self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}; known: {', '.join(PRESETS)}")
        if self.scenarios and self.preset != DEFAULT_PRESET:
            raise ValueError(f"the scenarios train the {DEFAULT_PRESET!r} preset; --preset is for a plain devnet")
        if self.tamper_step is not None and not 0 <= self.tamper_step < self.steps:
            raise ValueError(f"--tamper-step must be in [0, {self.steps})")
        if self.eval_every < 0 or (self.tamper_eval is not None and not (
                self.eval_every and 0 < self.tamper_eval <= self.steps and self.tamper_eval % self.eval_every == 0)):
            raise ValueError("--tamper-eval needs --eval-every and a state on its schedule")


