"""Every devnet scenario, with real daemon processes on loopback (``open1b-node devnet --scenario``).

To stay inside the CI budget, scenarios that do not disturb each other share one devnet (they
combine, as the CLI allows); crash and partition each get their own. The devnet reports what it
injected and detected, but these tests re-check what matters themselves: the signed evidence is
decoded and verified here, against the published manifest, and coverage is read from the
daemons' summary rather than from the scenario's verdicts alone.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from open1b.deterministic.runfile import read_manifest
from open1b.node.devnet import SCENARIOS
from open1b.protocol import (
    MATCH,
    MISMATCH,
    Attestation,
    WitnessReveal,
    validate_spotcheck,
    witness_binding,
    witness_commitment,
)

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "open1b.node.cli"]


def devnet(workdir: Path, *scenarios: str, steps: int = 8) -> dict:
    args = [a for s in scenarios for a in ("--scenario", s)]
    proc = subprocess.run([*CLI, "devnet", *args, "--steps", str(steps), "--workdir", str(workdir), "--json",
                           "--deadline", "240"], capture_output=True, text=True, timeout=420)
    assert proc.returncode in (0, 2), proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    summary["manifest"] = read_manifest(workdir / "run")
    summary["returncode"] = proc.returncode
    return summary


def peers(summary: dict, *roles: str) -> set[str]:
    return {n["peer_id"] for n in summary["per_node"] if n["role"] in roles}


def assert_network_kept_its_promises(summary: dict) -> None:
    assert summary["complete"], "the observer's coverage did not complete"
    assert summary["converged"], "honest nodes ended with different coverage"
    assert summary["lost"] == 0


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
        mine, other = (Attestation.decode(bytes.fromhex(e)) for e in report["evidence"][role])  # verifies
        flag = flags[liar]
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


# -- copying-auditor with lying-auditor: the copier's check says what coverage says ----------------
def test_a_copier_among_liars_is_judged_as_coverage_flags_it(tmp_path):
    """issue 17: combined, the copier may copy a liar's false statement; coverage then flags it for
    a contradiction (docs/protocol.md §8.2), not as a copier, and the scenario's own check must say
    the same as coverage: flagged (with the evidence its kind calls for) exactly when coverage flags
    it. (Whether coverage flags every adversary here is the protocol's business: with two trusted keys
    agreeing on a lie, flags can change as statements arrive — reported in issue 14's note.)"""
    s = devnet(tmp_path, "copying-auditor", "lying-auditor", steps=4)
    assert s["complete"] and s["lost"] == 0
    report = s["scenarios"]["copying-auditor"]
    [copier] = peers(s, "copier")
    flag = {f["signer"]: f for f in s["flagged"]}.get(copier)
    [(label, flagged)] = [(k, v) for k, v in report["checks"].items() if k.startswith("copier flagged")]
    assert flagged == (flag is not None), (label, flag)
    if flag is not None:
        assert report["detected"]["kind"] == flag["kind"] in ("copier", "contradiction")
        assert label == ("copier flagged as a copier" if flag["kind"] == "copier" else
                         "copier flagged for a contradiction")
        assert report["checks"]["evidence re-checks"]
        mine = Attestation.decode(bytes.fromhex(report["evidence"]["statement"]))  # verifies the signature
        other = Attestation.decode(bytes.fromhex(report["evidence"]["conflicting"]))
        assert mine.signer_peer_id == copier != other.signer_peer_id and mine.step == other.step == flag["step"]
        assert all(copier not in step["auditors"] + step["dissenters"] for step in s["per_step"])


# -- crash ---------------------------------------------------------------------------------------
def test_crash_mid_replay_leases_expire_others_retake_and_restarts_lose_nothing(tmp_path):
    s = devnet(tmp_path, "crash")
    assert_network_kept_its_promises(s)
    report = s["scenarios"]["crash"]
    assert report["injected"]["count"] == max(1, report["injected"]["of"] // 3)
    killed_steps = report["injected"]["steps"]
    assert all(report["detected"]["retake_seconds"][str(k)] is not None for k in killed_steps)
    assert all(n >= 1 for n in report["attestations_before_kill"].values())  # something to lose
    assert report["checks"]["restarted nodes lost no attestation"]
    assert all(n["running"] for n in s["per_node"])  # restarted
    for step in killed_steps:
        assert len(s["per_step"][step]["auditors"]) >= s["redundancy"]


# -- partition -----------------------------------------------------------------------------------
@pytest.mark.netns
def test_partition_both_halves_keep_working_and_converge_after_healing(tmp_path):
    args = [*CLI, "devnet", "--scenario", "partition", "--workdir", str(tmp_path), "--json", "--deadline", "300"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=480)
    if proc.returncode == 1 and "network namespaces" in proc.stderr:
        pytest.skip(f"no network namespaces here: {proc.stderr.strip()[-200:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads(proc.stdout)
    assert_network_kept_its_promises(s)
    report = s["scenarios"]["partition"]
    assert report["injected"]["halves"] == [3, 3]
    assert all(made >= 2 or alone for made, alone in zip(report["detected"]["attestations_made_per_half"],
                                                       report["detected"]["halves_complete_alone"]))
    assert report["checks"]["identical coverage after healing"]


# -- spot checks: forged-data, skipped-update, forged-microbatch in one devnet; refusing-trainer ---
def _recheck_spot_evidence(report: dict, manifest, step: int | None, links: tuple[str, ...]) -> None:
    """Each failing spot check in the report, decoded and judged here by the protocol's own rules
    against the published manifest: a valid ``fail`` of the forged step, by a link the spec names."""
    assert report["evidence"]
    for encoded in report["evidence"]:
        verdict = validate_spotcheck(bytes.fromhex(encoded), {manifest.run_id: manifest}.get, int(time.time()))
        assert verdict.accepted, verdict.code
        sc = verdict.message
        assert sc.verdict == "fail" and sc.caught in links and (step is None or sc.step == step)


@pytest.fixture(scope="module")
def forged_for_spot_checks(tmp_path_factory):
    return devnet(tmp_path_factory.mktemp("spot"), "forged-data", "skipped-update", "forged-microbatch")


@pytest.mark.parametrize("name, links", [("forged-data", ("loss", "gradient")), ("skipped-update", ("update",)),
                                         ("forged-microbatch", ("loss", "gradient"))])
def test_spot_checks_catch_each_forgery_before_full_coverage(forged_for_spot_checks, name, links):
    s, manifest = forged_for_spot_checks, forged_for_spot_checks["manifest"]
    assert_network_kept_its_promises(s)
    report = s["scenarios"][name]
    step = report["injected"]["step"]
    assert s["forged_steps"][str(step)] == name
    assert report["ok"], report["checks"]
    assert step in report["detected"]["failed"] and set(report["detected"]["caught"]) <= set(links)
    assert report["detected"]["flagged_s"] <= report["detected"]["covered_s"]
    assert 0 <= report["detected"]["escape_one_forged"] <= 1
    _recheck_spot_evidence(report, manifest, None, links)
    assert step in s["disputed_steps"]  # replays, taken first where the spot check failed, agree


def test_a_publisher_that_never_answers_fails_every_spot_check(tmp_path):
    s = devnet(tmp_path, "refusing-trainer")
    assert_network_kept_its_promises(s)
    report = s["scenarios"]["refusing-trainer"]
    assert report["ok"], report["checks"]
    assert report["detected"]["caught"] == ["no_answer"]
    _recheck_spot_evidence(report, s["manifest"], None, ("no_answer",))
    assert s["verified_steps"] == s["steps"]  # the run itself is honest: replays verify every step


# -- the command line ------------------------------------------------------------------------------
def test_unknown_scenario_is_an_error_that_names_the_known_ones():
    proc = subprocess.run([*CLI, "devnet", "--scenario", "meteor"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and all(name in proc.stderr for name in SCENARIOS)


def test_cli_help_lists_every_scenario():
    proc = subprocess.run([*CLI, "devnet", "--help"], capture_output=True, text=True, timeout=60)
    assert all(name in " ".join(proc.stdout.split()) for name in SCENARIOS)
