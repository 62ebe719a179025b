"""Devnet scenarios: a tampered trainer, lying auditors and a late joiner in one devnet; the
command line's scenario list (tests/scenarios/devnets.py: how the scenario tests are laid out)."""

from __future__ import annotations

import subprocess

import pytest

from open1b.devnet import SCENARIOS
from open1b.protocol import (
    MATCH,
    MISMATCH,
    Attestation,
)
from open1b.protocol.dispute import verify_fraud_proof
from open1b.protocol.hashing import blake2b256
from open1b.protocol.identity import public_key_from_peer_id

from .devnets import CLI, assert_network_kept_its_promises, devnet, peers

pytestmark = pytest.mark.integration


# -- tampered-step, lying-auditor, late-joiner: one devnet -------------------------------------
@pytest.fixture(scope="module")
def adversarial(tmp_path_factory):
    return devnet(tmp_path_factory.mktemp("adversarial"), "tampered-step", "lying-auditor", "late-joiner")


def test_tampered_steps_end_refuted_with_evidence_anyone_can_check(adversarial):
    s, manifest = adversarial, adversarial["manifest"]
    assert_network_kept_its_promises(s)
    forged = sorted(int(k) for k in s["forged_steps"])
    assert sorted(s["forged_steps"].values()) == ["batch", "bitflip", "skip"]
    assert s["disputed_steps"] == s["refuted_steps"] == forged
    assert all(step["status"] == "verified" for step in s["per_step"] if step["step"] not in forged)
    honest = peers(s, "auditor", "late")
    evidence = s["scenarios"]["tampered-step"]["evidence"]
    for step in forged:
        statements = [Attestation.decode(bytes.fromhex(e)) for e in evidence[str(step)]]  # verifies signatures
        assert len({a.signer for a in statements}) >= 2  # independent replays confirm
        for att in statements:
            assert att.run == manifest.run_id and att.step == step and att.verdict == MISMATCH
            assert att.pre_state == manifest.state_hashes[step] and att.post_state != manifest.state_hashes[step + 1]
            assert att.signer_peer_id in honest
        assert len({a.post_state for a in statements}) == 1  # deterministic replays agree on the truth
    assert s["scenarios"]["tampered-step"]["ok"]


def test_lying_auditors_are_flagged_by_two_conflicting_statements_and_stop_counting(adversarial):
    s, manifest = adversarial, adversarial["manifest"]
    report = s["scenarios"]["lying-auditor"]
    liars = report["liars"]
    assert report["injected"]["count"] == 2 * manifest.steps  # every step, twice, without replaying
    flags = {f["signer"]: f for f in s["flagged"]}
    assert set(liars.values()) <= set(flags)
    for role, liar in liars.items():
        flag = flags[liar]
        if flag["kind"] == "fraud":  # a dispute convicted it first (§8.3 step 9): the proof is the evidence
            [proof] = (bytes.fromhex(e) for e in report["evidence"][role])
            verdict = verify_fraud_proof(proof)
            assert verdict.accepted and public_key_from_peer_id(liar) in verdict.guilty
            assert blake2b256(proof).hex() == flag["statement"]
            continue
        mine, other = (Attestation.decode(bytes.fromhex(e)) for e in report["evidence"][role])  # verifies
        assert mine.signer_peer_id == liar and mine.digest.hex() == flag["statement"]
        assert other.digest.hex() == flag["conflicting"] and other.signer_peer_id in peers(s, "auditor", "late")
        assert mine.step == other.step == flag["step"] and mine.pre_state == other.pre_state
        assert mine.post_state != other.post_state
        if role == "liar":  # it vouched for a forged state: the honest replay it contradicts disagrees
            assert (mine.verdict, other.verdict) == (MATCH, MISMATCH)
            assert other.post_state != manifest.state_hashes[flag["step"] + 1]
        else:  # it disputed with a made-up result: an honest replay it contradicts got another one
            assert mine.verdict == MISMATCH
    assert all(not set(liars.values()) & set(step["auditors"] + step["dissenters"]) for step in s["per_step"])
    assert all(len(set(step["auditors"] + step["dissenters"])) >= s["redundancy"] for step in s["per_step"])


def test_late_joiner_reports_the_same_coverage(adversarial):
    report = adversarial["scenarios"]["late-joiner"]
    assert report["checks"] == {"reports the same coverage": True}
    late = next(n for n in adversarial["per_node"] if n["role"] == "late")
    assert late["running"] and late["peer_id"] not in {f["signer"] for f in adversarial["flagged"]}


# -- the command line ------------------------------------------------------------------------------
def test_unknown_scenario_is_an_error_that_names_the_known_ones():
    proc = subprocess.run([*CLI, "devnet", "--scenario", "meteor"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and all(name in proc.stderr for name in SCENARIOS)

