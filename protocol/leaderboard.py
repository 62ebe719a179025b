"""The auto-certified leaderboard (docs/protocol.md §8.6): runs ranked by certified evaluation loss.

A pure function of the manifests and signed statements a node holds and its trust policy, so two
nodes holding the same statements show the same board. A run is *ranked* only when its latest
certified evaluation exists and nothing about it is disputed (no disputed step, no disputed
evaluation); every other run is listed unranked, with the reason. Losses are comparable only on
the same evaluation set, so the board is split by ``eval_root``: a rank is within its set.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, replace
from typing import Any, Iterable, Sequence

from .coverage import StepStatus, TrustPolicy, coverage
from .evaluation import EvalStatement, EvalStatus, eval_schedule, evaluations
from .messages import Attestation, Claim
from .witness import WitnessReveal


@dataclass(frozen=True)
class BoardRow:
    run: bytes
    eval_set: str  # the run's eval_root (hex): rows are ranked only against rows of the same set
    rank: int | None  # 1-based within eval_set; None: not ranked (see ``reason``)
    loss: float | None  # the latest certified evaluation loss (a float32 value)
    loss_bits: int | None
    eval_state: int | None  # the state that loss is of
    certified: int  # scheduled evaluations by status
    disputed: int
    unchecked: int
    verified_steps: int  # steps verified by replay (coverage status "verified")
    steps: int
    disputed_steps: int
    devices: tuple[str, ...]  # device classes behind the verified steps, sorted
    reason: str  # why the row is not ranked ("" when it is)

    @property
    def replayed(self) -> float:
        return self.verified_steps / self.steps

    def to_json(self) -> dict:
        return {"run": self.run.hex(), "eval_set": self.eval_set, "rank": self.rank, "loss": self.loss,
                "loss_bits": self.loss_bits, "eval_state": self.eval_state,
                "evaluations": {"certified": self.certified, "disputed": self.disputed, "unchecked": self.unchecked},
                "replayed": self.replayed, "verified_steps": self.verified_steps, "steps": self.steps,
                "disputed_steps": self.disputed_steps, "devices": list(self.devices),
                "reason": self.reason}  # fmt: skip


def leaderboard(runs: Iterable[Any], attestations: Sequence[Attestation], evals: Sequence[EvalStatement], *,
                claims: Sequence[Claim] = (), reveals: Sequence[WitnessReveal] = (), now: int = 0,
                redundancy: int = 1, policy: TrustPolicy = TrustPolicy(), min_keys: int = 1) -> tuple[BoardRow, ...]:
    """Every run with an evaluation schedule, ranked rows first (by eval set, then loss, then run
    id), then unranked ones (by eval set, then run id)."""
    rows = []
    for run in runs:
        if not eval_schedule(run):
            continue
        cov = coverage(run, attestations, claims, reveals=reveals, now=now, redundancy=redundancy, policy=policy)
        evs = evaluations(run, evals, policy=policy, min_keys=min_keys)
        certified = [e for e in evs if e.status is EvalStatus.CERTIFIED]
        disputed = sum(1 for e in evs if e.status is EvalStatus.DISPUTED)
        latest = certified[-1] if certified else None
        reason = ("no certified evaluation" if latest is None
                  else "not a finite, non-negative loss" if not 0 <= _f32(latest.loss) < math.inf  # NaN sorts nowhere
                  else "disputed evaluation" if disputed else "disputed steps" if cov.disputed_steps else "")
        rows.append(BoardRow(
            run.run_id, run.data["eval_root"], None, _f32(latest.loss) if latest else None,
            latest.loss if latest else None, latest.state if latest else None, len(certified), disputed,
            len(evs) - len(certified) - disputed, cov.count(StepStatus.VERIFIED), run.steps, len(cov.disputed_steps),
            tuple(sorted({d for s in cov.steps if s.status is StepStatus.VERIFIED for d in s.devices})), reason))
    ranked = sorted((r for r in rows if not r.reason), key=lambda r: (r.eval_set, r.loss, r.run))
    out, place = [], {}
    for r in ranked:
        place[r.eval_set] = place.get(r.eval_set, 0) + 1
        out.append(replace(r, rank=place[r.eval_set]))
    return tuple(out + sorted((r for r in rows if r.reason), key=lambda r: (r.eval_set, r.run)))


def _f32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]
