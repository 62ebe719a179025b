"""Coverage: what a set of attestations says about each step of a run.

``coverage`` is a pure function of (manifest, attestations, claims, now): two nodes holding the
same statements report the same coverage whatever order they heard them in. Attestations that
are inconsistent with the manifest are not counted (validation already keeps them out of
stores; coverage re-checks so that it is safe on any input set).

Status of a step, first rule that applies:

* ``disputed``  — at least one auditor reports a mismatch;
* ``verified``  — at least one auditor reports a match;
* ``claimed``   — someone holds a live claim on it;
* ``unaudited`` — none of the above.

``auditors`` counts *distinct* signing keys; a step *meets the target* when its distinct
auditors (either verdict) reach the requested redundancy.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterable

from .claims import is_live
from .errors import ProtocolError
from .identity import peer_id_from_public_key
from .messages import MATCH, Attestation, Claim
from .validation import Run, check_attestation, check_claim


class StepStatus(str, enum.Enum):
    UNAUDITED = "unaudited"
    CLAIMED = "claimed"
    VERIFIED = "verified"
    DISPUTED = "disputed"


@dataclass(frozen=True)
class StepCoverage:
    step: int
    status: StepStatus
    auditors: tuple[str, ...]  # peer IDs that attested a match, sorted
    dissenters: tuple[str, ...]  # peer IDs that attested a mismatch, sorted
    claimants: tuple[str, ...]  # peer IDs holding a live claim, sorted

    @property
    def attesters(self) -> int:
        return len(set(self.auditors) | set(self.dissenters))


@dataclass(frozen=True)
class Coverage:
    run: bytes
    redundancy: int
    steps: tuple[StepCoverage, ...]

    def count(self, status: StepStatus) -> int:
        return sum(1 for s in self.steps if s.status == status)

    @property
    def disputed_steps(self) -> list[int]:
        return [s.step for s in self.steps if s.status is StepStatus.DISPUTED]

    @property
    def complete(self) -> bool:
        """Every step has at least ``redundancy`` distinct attesters."""
        return all(s.attesters >= self.redundancy for s in self.steps)


def coverage(
    manifest: Run,
    attestations: Iterable[Attestation],
    claims: Iterable[Claim] = (),
    *,
    now: int = 0,
    redundancy: int = 1,
) -> Coverage:
    if redundancy < 1:
        raise ValueError("redundancy must be at least 1")
    matches: list[set[bytes]] = [set() for _ in range(manifest.steps)]
    mismatches: list[set[bytes]] = [set() for _ in range(manifest.steps)]
    live: list[set[bytes]] = [set() for _ in range(manifest.steps)]
    for att in attestations:
        if att.run != manifest.run_id or not _consistent(att, manifest):
            continue
        (matches if att.verdict == MATCH else mismatches)[att.step].add(att.signer)
    for claim in claims:
        if claim.run == manifest.run_id and is_live(claim, now) and _claim_ok(claim, manifest):
            live[claim.step].add(claim.claimant)

    def ids(keys: set[bytes]) -> tuple[str, ...]:
        return tuple(sorted(peer_id_from_public_key(k) for k in keys))

    steps = []
    for k in range(manifest.steps):
        if mismatches[k]:
            status = StepStatus.DISPUTED
        elif matches[k]:
            status = StepStatus.VERIFIED
        elif live[k]:
            status = StepStatus.CLAIMED
        else:
            status = StepStatus.UNAUDITED
        steps.append(StepCoverage(k, status, ids(matches[k]), ids(mismatches[k]), ids(live[k])))
    return Coverage(manifest.run_id, redundancy, tuple(steps))


def _consistent(att: Attestation, manifest: Run) -> bool:
    try:
        check_attestation(att, manifest)
    except ProtocolError:
        return False
    return True


def _claim_ok(claim: Claim, manifest: Run) -> bool:
    try:
        check_claim(claim, manifest)
    except ProtocolError:
        return False
    return True
