"""JSON views of the node's statements and state: one rendering shared by the API and the CLI."""

from __future__ import annotations

from typing import Collection, Mapping, Sequence

from open1b.protocol import (
    Attestation,
    Claim,
    Coverage,
    RunManifest,
    SpotCheck,
    SpotCoverage,
    SpotStatus,
    StepStatus,
    WitnessReveal,
    peer_id_from_public_key,
)

from .earned_trust import Pair


def attestation_json(att: Attestation, received_ms: int | None = None) -> dict:
    return {
        "received_at_ms": received_ms,
        "digest": att.digest.hex(), "run": att.run.hex(), "step": att.step, "verdict": att.verdict,
        "pre_state": att.pre_state.hex(), "post_state": att.post_state.hex(), "signer": att.signer_peer_id,
        "engine": f"{att.engine} {att.engine_version}", "hardware": att.hardware, "device": att.device,
        "elapsed_ms": att.elapsed_ms, "issued_at": att.issued_at,
        "encoded": att.encoded.hex(),  # the signed statement itself: anyone can re-check it
    }


def spotcheck_json(sc: SpotCheck) -> dict:
    return {
        "digest": sc.digest.hex(), "run": sc.run.hex(), "step": sc.step, "verdict": sc.verdict, "caught": sc.caught,
        "slot": sc.slot, "chunks": list(sc.chunks), "signer": sc.signer_peer_id, "device": sc.device,
        "elapsed_ms": sc.elapsed_ms, "issued_at": sc.issued_at,
        "encoded": sc.encoded.hex(),  # the signed statement itself: anyone can re-check it
    }


def reveal_json(reveal: WitnessReveal) -> dict:
    return {
        "digest": reveal.digest.hex(), "run": reveal.run.hex(), "step": reveal.step, "witness": reveal.witness.hex(),
        "revealer": reveal.signer_peer_id, "issued_at": reveal.issued_at,
        "encoded": reveal.encoded.hex(),  # the signed statement itself
    }


def claim_json(claim: Claim, now: int) -> dict:
    return {
        "run": claim.run.hex(), "step": claim.step, "slot": claim.slot,
        "claimant": peer_id_from_public_key(claim.claimant), "issued_at": claim.issued_at,
        "lease_expiry": claim.lease_expiry, "expires_in_s": claim.lease_expiry - now,
        "expected_done": claim.expected_done,  # when the claimant expects to attest (docs/protocol.md §10.1)
        "device": claim.device,  # the device class it replays on, if it said (docs/protocol.md §10.1)
    }


def coverage_json(cov: Coverage, manifest: RunManifest, earned: Collection[bytes] = ()) -> dict:
    """``earned``: the keys among the policy's roots that earned trust (the rest are listed)."""
    return {
        "run": cov.run.hex(), "steps": manifest.steps, "redundancy": cov.redundancy,
        "verified_steps": cov.count(StepStatus.VERIFIED), "disputed_steps": cov.disputed_steps,
        "refuted_steps": cov.refuted_steps,
        "claimed_steps": cov.count(StepStatus.CLAIMED), "unaudited_steps": cov.count(StepStatus.UNAUDITED),
        "complete": cov.complete,
        "policy": {"name": cov.policy.name, "roots": sorted(peer_id_from_public_key(k) for k in cov.policy.roots),
                   "earned": sorted(peer_id_from_public_key(k) for k in earned if k in cov.policy.roots),
                   "quorum": cov.policy.quorum},
        # evidence: digests of signed attestations (and, for a copier, of the witness reveal its
        # binding fails; for a fraud flag, of the proof), which /v1/attestations, /v1/reveals and
        # /v1/disputes serve for anyone to re-check
        "flagged": [{"signer": f.signer, "step": f.step, "kind": f.kind, "statement": f.statement.hex(),
                     "conflicting": f.conflicting.hex(), "reveal": f.reveal.hex() or None} for f in cov.flagged],
        "untrusted": list(cov.untrusted),
        "device_classes": list(cov.device_classes),
        "per_step": [{"step": s.step, "status": s.status.value, "auditors": list(s.auditors),
                      "dissenters": list(s.dissenters), "claimants": list(s.claimants),
                      "evidence": [d.hex() for d in s.evidence], "devices": list(s.devices),
                      "fraud_proofs": [d.hex() for d in s.fraud_proofs]} for s in cov.steps],
    }


def earned_json(earned: Mapping[bytes, Sequence[Pair]]) -> list[dict]:
    """Earned keys with their evidence: the (run, step) pairs on which each proved a replay."""
    return sorted(({"peer_id": peer_id_from_public_key(k),
                    "pairs": [{"run": p.run.hex(), "step": p.step, "publisher": peer_id_from_public_key(p.publisher)}
                              for p in pairs]} for k, pairs in earned.items()), key=lambda e: e["peer_id"])


def spot_json(spot: SpotCoverage, why_not: str | None = None) -> dict:
    """Spot checks (docs/protocol.md §8.7): their own status, never counted as replays, and the
    probability that a run with one forged step, or 1% of its steps forged, escaped every check so far.
    ``why_not``: why this node does not spot check the run (a run without fingerprints), or None."""
    return {
        "spot_checkable": why_not is None, "not_spot_checked_because": why_not,
        "spot_checked_steps": spot.count(SpotStatus.SPOT_CHECKED), "spot_failed_steps": spot.failed_steps,
        "detection_per_check": spot.detection, "escape_one_forged": spot.escape_one,
        "escape_one_percent_forged": spot.escape_fraction,
        "per_step": [{"step": s.step, "status": s.status.value, "checkers": list(s.checkers), "caught": list(s.caught),
                      "evidence": [d.hex() for d in s.evidence]} for s in spot.steps if s.status is not SpotStatus.UNCHECKED],
    }


def run_json(manifest: RunManifest, run_dir: str | None) -> dict:
    return {
        "run": manifest.run_id.hex(), "steps": manifest.steps, "engine": f"{manifest.engine} {manifest.engine_version}",
        "publisher": manifest.signer_peer_id, "created_at": manifest.created_at, "run_dir": run_dir,
    }
