"""Devnet scenario: auditors killed mid-replay."""

from __future__ import annotations

import pytest

from .devnets import assert_network_kept_its_promises, devnet

pytestmark = pytest.mark.integration


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
