"""Integration: real open1b-node daemon processes on loopback, driven through the CLI and API."""

import json
import subprocess
import sys
import time

import pytest

from open1b.devnet import Daemons
from open1b.node.client import call
from open1b.protocol import MISMATCH, Attestation

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "open1b.node.cli"]


def _cli(*args, timeout=240):
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


def test_devnet_verifies_every_step():
    rc, out, err = _cli("devnet", "--nodes", "3", "--steps", "8", "--redundancy", "1", "--eval-every", "4", "--json")
    assert rc == 0, err
    summary = json.loads(out)
    assert summary["complete"] and summary["verified_steps"] == 8 and summary["disputed_steps"] == []
    # the run's evaluations (states 4 and 8) end certified, and it tops the observer's board
    assert [(e["state"], e["status"]) for e in summary["evaluations"]] == [(4, "certified"), (8, "certified")]
    assert summary["leaderboard_is_the_statements"] and summary["leaderboard"][0]["rank"] == 1
    assert summary["nodes"] == 3 and summary["steps"] == 8 and summary["redundancy"] == 1
    assert summary["queried_from"]["replays"] == 0  # coverage came from a node that replayed nothing
    assert summary["replays"] >= 8
    # every step replayed: no forged run escapes (docs/protocol.md §8.7; spot checks would only add to it)
    assert summary["escape_one_forged"] == summary["escape_one_percent_forged"] == 0.0
    auditors = {n["peer_id"] for n in summary["per_node"] if n["audit"]}
    assert all(s["status"] == "verified" and set(s["auditors"]) <= auditors for s in summary["per_step"])
    assert sum(n["replays"] for n in summary["per_node"]) == summary["replays"]


def test_devnet_evaluations_end_certified_and_a_tampered_one_disputed():
    rc, out, err = _cli("devnet", "--nodes", "2", "--steps", "4", "--eval-every", "2", "--tamper-eval", "4", "--json")
    assert rc == 0, err
    summary = json.loads(out)
    assert summary["complete"] and summary["disputed_steps"] == []
    auditors = {n["peer_id"] for n in summary["per_node"] if n["audit"]}
    (certified, disputed) = summary["evaluations"]
    assert (certified["state"], certified["status"], disputed["state"], disputed["status"]) == (
        2, "certified", 4, "disputed")
    # the devnet stops once every evaluation is settled: at redundancy 1, one auditor's check settles it
    assert set(certified["checkers"]) <= auditors and set(disputed["dissenters"]) <= auditors
    assert certified["checkers"] and disputed["dissenters"] and not certified["dissenters"]
    # the observer's board is the one its signed statements imply; the disputed run is not ranked
    assert summary["leaderboard_is_the_statements"]
    (row,) = summary["leaderboard"]
    assert row["rank"] is None and row["reason"] == "disputed evaluation" and row["evaluations"]["certified"] == 1


def test_devnet_tamper_step_disputes_exactly_that_step():
    rc, out, err = _cli("devnet", "--nodes", "3", "--steps", "8", "--redundancy", "1", "--tamper-step", "3", "--json")
    assert rc == 0, err
    summary = json.loads(out)
    assert summary["disputed_steps"] == [3]
    assert summary["verified_steps"] == 7
    assert [s["step"] for s in summary["per_step"] if s["dissenters"]] == [3]


def test_live_network_answers_coverage_cli_with_signed_evidence(tmp_path, tampered_run):
    run_dir, manifest = tampered_run
    run_hex = manifest.run_id.hex()
    daemons = Daemons(tmp_path, run_dir, redundancy=1)
    try:
        addrs = daemons.plan(4)
        for i in range(4):
            daemons.start(i, audit=i < 3, bootstrap=[addrs[1 if i == 0 else 0]])
        observer = daemons.api(3)
        daemons.publish(3)
        deadline = time.monotonic() + 120
        while not call(observer, f"/v1/coverage/{run_hex}")["complete"]:
            assert time.monotonic() < deadline, "coverage did not complete"
            time.sleep(0.5)

        rc, out, err = _cli("coverage", run_hex[:12], "--api", observer, "--json")
        assert rc == 0, err
        cov = json.loads(out)
        assert cov["disputed_steps"] == [2] and cov["verified_steps"] == manifest.steps - 1

        rc, out, _ = _cli("coverage", run_hex[:12], "--api", observer)
        assert rc == 0 and "disputed [2]" in out

        rc, out, err = _cli("status", "--api", observer, "--json")
        status = json.loads(out)
        assert status["replays"] == 0 and len(status["peers"]) >= 1 and status["runs"] == [run_hex]

        # the dispute is backed by a signed statement any node can re-check on its own
        evidence = call(observer, f"/v1/attestations/{run_hex}?step=2")
        assert evidence
        # read after the evidence: a disputed step is still being replayed again (it wants one more
        # attester), and a store only grows, so this coverage counts every statement fetched above
        cov = call(observer, f"/v1/coverage/{run_hex}")
        for item in evidence:
            att = Attestation.decode(bytes.fromhex(item["encoded"]))  # verifies the signature
            assert att.verdict == MISMATCH and att.step == 2
            assert att.pre_state == manifest.state_hashes[2] and att.post_state != manifest.state_hashes[3]
            assert att.signer_peer_id in cov["per_step"][2]["dissenters"]

        rc, _, err = _cli("coverage", "ffff", "--api", observer)
        assert rc == 1 and "no single known run" in err
    finally:
        daemons.stop()
    assert all(p.returncode == 0 for p in daemons.procs)  # clean shutdown through the API
