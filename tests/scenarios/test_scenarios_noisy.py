"""Devnet scenarios: forged and malformed statements, Sybil keys and a copying auditor in one devnet."""

from __future__ import annotations

import pytest

from open1b.protocol import (
    MATCH,
    Attestation,
    WitnessReveal,
    witness_binding,
    witness_commitment,
)

from .devnets import assert_network_kept_its_promises, devnet, peers

pytestmark = pytest.mark.integration


# -- forged-and-malformed, sybil, copying-auditor: one devnet ----------------------------------
@pytest.fixture(scope="module")
def noisy(tmp_path_factory):
    return devnet(tmp_path_factory.mktemp("noisy"), "forged-and-malformed", "sybil", "copying-auditor")


def test_forged_and_malformed_statements_are_refused_penalised_and_never_stored(noisy):
    assert_network_kept_its_promises(noisy)
    report = noisy["scenarios"]["forged-and-malformed"]
    [spammer] = peers(noisy, "spammer")
    kinds = report["injected"]["kinds"]
    assert len(kinds) == 11 and all(n >= 3 for n in kinds.values())  # 3 of each kind per burst
    assert all(report["answered"].values()), report["answered"]
    assert report["lost"] == 0 and report["checks"]["nothing forged stored"]
    by_code = report["detected"]["by_code"]
    for code in ("bad_signature", "malformed", "oversize", "non_canonical", "kind", "verdict"):
        assert by_code.get(f"reject/{code}", 0) > 0, code
    assert by_code.get("ignore/unknown_run", 0) > 0 and by_code.get("ignore/future", 0) > 0
    assert all(node["running"] for node in noisy["per_node"])  # nobody crashed
    assert report["checks"]["every node that refused one penalised its sender"]
    assert report["checks"]["no honest peer penalised"] and report["checks"]["sender banned"]
    assert any(spammer in (node["banned"] or []) for node in noisy["per_node"] if node["role"] == "auditor")


def test_sybil_keys_do_not_inflate_coverage_under_the_default_policy(noisy):
    report = noisy["scenarios"]["sybil"]
    members = {n["peer_id"] for n in noisy["per_node"]}
    counted = {p for step in noisy["per_step"] for p in step["auditors"] + step["dissenters"]}
    assert counted <= members  # every counted key is one of the devnet's own
    assert report["detected"]["count"] == 20  # all fresh keys reached the observer, none counted
    # the attack was real: under `open` each fresh key is counted in every step, unless the proof of
    # replay caught it (a made-up witness binding fails a step's reveal: flagged a copier)
    detected = report["detected"]
    assert detected["min_attesters_per_step_under_open"] + detected["caught_as_copiers_under_open"] >= 20
    assert noisy["complete"]


def test_copying_auditor_is_caught_by_the_proof_of_replay(noisy):
    s, manifest = noisy, noisy["manifest"]
    report = s["scenarios"]["copying-auditor"]
    assert report["injected"]["count"] >= s["steps"]  # it did copy a result for every step
    [copier] = peers(s, "copier")
    flags = {f["signer"]: f for f in s["flagged"]}
    flag = flags[copier]
    assert flag["kind"] == "copier"
    # the evidence, re-checked here from the signed bytes against the manifest alone
    evidence = report["evidence"]
    mine = Attestation.decode(bytes.fromhex(evidence["statement"]))
    other = Attestation.decode(bytes.fromhex(evidence["conflicting"]))
    reveal = WitnessReveal.decode(bytes.fromhex(evidence["reveal"]))
    step = flag["step"]
    assert (mine.digest.hex(), other.digest.hex(), reveal.digest.hex()) == (
        flag["statement"], flag["conflicting"], flag["reveal"])
    assert reveal.run == mine.run == other.run == manifest.run_id and reveal.step == mine.step == other.step == step
    assert witness_commitment(reveal.witness) == manifest.witnesses[step]  # the trainer's committed W_k
    assert mine.signer_peer_id == copier and mine.verdict == MATCH
    assert mine.witness != witness_binding(manifest.run_id, step, mine.signer, reveal.witness)  # never knew W_k
    assert other.signer_peer_id in peers(s, "auditor", "late")  # an honest replay that did know it
    assert other.witness == witness_binding(manifest.run_id, step, other.signer, reveal.witness)
    assert reveal.signer_peer_id in peers(s, "auditor", "late")
    # its attestations do not count, and no honest node is flagged
    assert all(copier not in step["auditors"] + step["dissenters"] for step in s["per_step"])
    assert not set(flags) & peers(s, "auditor", "observer", "late")
    assert report["ok"], report["checks"]
