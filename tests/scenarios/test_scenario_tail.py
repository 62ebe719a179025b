"""Devnet scenarios of issue 30: a straggler whose step fast auditors re-claim speculatively, and
auditors of two device classes (docs/protocol.md §10.1)."""

from __future__ import annotations

import pytest

from open1b.devnet.scenarios.straggler import STRAGGLE_S

from .devnets import assert_network_kept_its_promises, devnet

pytestmark = pytest.mark.integration


def test_a_declared_straggler_is_raced_on_the_speculative_slot_and_counted_once(tmp_path):
    s = devnet(tmp_path, "straggler")
    assert_network_kept_its_promises(s)
    report = s["scenarios"]["straggler"]
    assert report["ok"], report["checks"]
    # its first claim says it is slow (a renewal repeats expected_done, so it comes sooner after the renewal)
    assert report["injected"]["expected_done_in_s"] and max(report["injected"]["expected_done_in_s"]) >= STRAGGLE_S
    held = set(report["injected"]["steps_held"])
    spec = report["detected"]["claims"]
    # a slot beyond the R wanted ones, on a step the straggler held, by a fast auditor that said
    # when it would be done: sooner than the straggler
    assert spec and all(c["slot"] == s["redundancy"] and c["step"] in held for c in spec)
    assert all(c["expected_done_in_s"] is not None and c["expected_done_in_s"] < STRAGGLE_S for c in spec)
    for race in report["detected"]["raced"]:
        step = s["per_step"][race["step"]]
        assert race["straggler_after_s"] > 0
        # both replays count, each once: the straggler is one more attester, never a second vote of another
        assert len(step["auditors"]) == len(set(step["auditors"])) >= s["redundancy"] + 1
    for k, p in report["per_step"].items():  # every step: one count per distinct signer of a match
        assert sorted(p["auditors"]) == p["match_signers"], k


def test_every_step_is_matched_by_both_declared_device_classes(tmp_path):
    """Issue 30: a devnet whose auditors report two device classes ends with every step matched by
    both at redundancy 2 (the class wait, docs/protocol.md §10.1, with claims naming their class:
    r21), and coverage reports per step the distinct classes that matched it, which
    ``coverage --min-classes 2`` reads."""
    s = devnet(tmp_path, "device-classes")
    assert_network_kept_its_promises(s)
    assert s["redundancy"] == 2
    report = s["scenarios"]["device-classes"]
    cpu = set()
    for step in s["per_step"]:  # re-checked from the daemons' coverage, not the scenario's verdict
        assert len(step["auditors"]) >= 2 and step["devices"] == sorted(set(step["devices"]))
        declared, others = [d for d in step["devices"] if d == "cuda/sm_90"], [d for d in step["devices"] if d != "cuda/sm_90"]
        assert declared and len(others) == 1 and others[0].startswith("cpu/"), (step, report["classes"])
        cpu.update(others)
    assert len(cpu) == 1  # one machine: one CPU class beside the declared one
    assert report["ok"] and report["every_step_both"] and report["detected"]["count"] == len(s["per_step"]), report
