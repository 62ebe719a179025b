"""Devnet scenario: a copying auditor among lying ones."""

from __future__ import annotations

import pytest

from open1b.protocol import (
    Attestation,
)
from open1b.protocol.dispute import verify_fraud_proof
from open1b.protocol.hashing import blake2b256
from open1b.protocol.identity import public_key_from_peer_id

from .devnets import devnet, peers

pytestmark = pytest.mark.integration


# -- copying-auditor with lying-auditor: the copier's check says what coverage says ----------------
def test_a_copier_among_liars_is_judged_as_coverage_flags_it(tmp_path):
    """issue 17: combined, the copier may copy a liar's false statement; coverage then flags it for
    a contradiction (docs/protocol.md §8.2), not as a copier, and the scenario's own check must say
    the same as coverage: flagged (with the evidence its kind calls for) exactly when coverage flags
    it. (Whether coverage flags every adversary here is the protocol's business: with two trusted keys
    agreeing on a lie, flags can change as statements arrive — reported in issue 14's note.)"""
    # Redundancy 3: the liar and the copier (copying the liar's matches) are two trusted keys that
    # agree without replaying, and redundancy must exceed them (docs/reliability.md, "Settling counts
    # keys"). At 2 they covered every step before any honest node claimed one, once honest nodes
    # claim only after their worker's start: the run then ended "complete" with no honest replay, no
    # witness revealed and nobody flagged, and the devnet waited out its deadline. Before, the
    # scenario passed only because honest claims raced the liars' first statements.
    s = devnet(tmp_path, "copying-auditor", "lying-auditor", steps=4, redundancy=3)
    assert s["complete"] and s["lost"] == 0
    report = s["scenarios"]["copying-auditor"]
    [copier] = peers(s, "copier")
    flag = {f["signer"]: f for f in s["flagged"]}.get(copier)
    [(label, flagged)] = [(k, v) for k, v in report["checks"].items() if k.startswith("copier flagged")]
    assert flagged == (flag is not None), (label, flag)
    if flag is not None and flag["kind"] == "fraud":  # a dispute convicted it (§8.3 step 9)
        assert label == "copier flagged by a fraud proof" and report["checks"]["evidence re-checks"]
        proof = bytes.fromhex(report["evidence"]["proof"])
        verdict = verify_fraud_proof(proof)
        assert verdict.accepted and public_key_from_peer_id(copier) in verdict.guilty
        assert blake2b256(proof).hex() == flag["statement"]
    elif flag is not None:
        assert report["detected"]["kind"] == flag["kind"] in ("copier", "contradiction")
        assert label == ("copier flagged as a copier" if flag["kind"] == "copier" else
                         "copier flagged for a contradiction")
        assert report["checks"]["evidence re-checks"]
        mine = Attestation.decode(bytes.fromhex(report["evidence"]["statement"]))  # verifies the signature
        other = Attestation.decode(bytes.fromhex(report["evidence"]["conflicting"]))
        assert mine.signer_peer_id == copier != other.signer_peer_id and mine.step == other.step == flag["step"]
        assert all(copier not in step["auditors"] + step["dissenters"] for step in s["per_step"])
