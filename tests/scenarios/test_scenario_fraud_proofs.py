"""The fraud-proof scenarios on a real devnet at tiny (devnet/scenarios/fraud_proofs.py):
``forged-op``, a trainer that forged one op of one step is convicted by a fraud proof from a
bisection, and every honest node refutes the step citing the proof without a vote (one auditor:
one dissenting replay, where a vote needs two); ``false-accusation``, an auditor that signed a
false mismatch and defends it in a dispute is the one the proof convicts and every node flags."""

from __future__ import annotations

import pytest

from open1b.protocol.dispute import verify_fraud_proof

from .devnets import assert_network_kept_its_promises, devnet

pytestmark = pytest.mark.integration


def test_a_forged_op_is_convicted_by_a_proof_and_refuted_without_a_vote(tmp_path):
    s = devnet(tmp_path, "forged-op", steps=4, nodes=1)
    report, manifest = s["scenarios"]["forged-op"], s["manifest"]
    assert_network_kept_its_promises(s)
    assert report["ok"], report["checks"]
    step = report["injected"]["step"]
    assert s["refuted_steps"] == [step]
    assert report["detected"]["dissenters"] == 1  # one auditor: no quorum to count
    verdict = verify_fraud_proof(bytes.fromhex(report["proof"]))  # the proof stands alone
    assert verdict.accepted and verdict.guilty == (manifest.publisher,) and verdict.op == "gelu"
    assert (verdict.run, verdict.step, verdict.position) == (manifest.run_id, step, report["detected"]["position"])
    assert 0 < report["detected"]["rounds"] <= (report["detected"]["ops"] - 1).bit_length() + 1


def test_a_false_accusation_defended_in_a_dispute_convicts_the_accuser(tmp_path):
    s = devnet(tmp_path, "false-accusation", steps=4, nodes=1)
    report, manifest = s["scenarios"]["false-accusation"], s["manifest"]
    assert_network_kept_its_promises(s)
    assert report["ok"], report["checks"]
    assert s["refuted_steps"] == [] and all(step["status"] == "verified" for step in s["per_step"])
    verdict = verify_fraud_proof(bytes.fromhex(report["proof"]))
    accuser = next(n["peer_id"] for n in s["per_node"] if n["role"] == "accuser")
    assert verdict.accepted and verdict.guilty_peers == (accuser,) and manifest.publisher not in verdict.guilty
    assert [(f["signer"], f["kind"]) for f in s["flagged"]] == [(accuser, "fraud")]


@pytest.mark.parametrize("scenario, outcome", [("silent-disputant", "peer_silent"),
                                               ("oversized-disputant", "peer_malformed")])
def test_a_trainer_that_goes_silent_or_sends_an_oversized_message_loses_its_dispute(tmp_path, scenario, outcome):
    s = devnet(tmp_path, scenario, steps=4, nodes=1)
    report = s["scenarios"][scenario]
    assert_network_kept_its_promises(s)
    assert report["ok"], report["checks"]
    ended, step = report["detected"], report["injected"]["step"]
    trainer = next(n["peer_id"] for n in s["per_node"] if n["role"] == "observer")
    assert (ended["outcome"], ended["peer"], ended["step"], ended["proof_bytes"]) == (outcome, trainer, step, None)
    assert ended["rounds"] == 1  # it went wrong in the first round down the trace tree
    if outcome == "peer_silent":
        assert ended["seconds"] >= 3.0 and ended["penalties"] == 0  # silence proves nothing: no penalty
    else:
        assert ended["penalties"] == 1
    assert s["refuted_steps"] == [] and step in s["disputed_steps"]
