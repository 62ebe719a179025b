"""Devnet scenario: nodes at home behind NAT routers (devnet/nat_topology.py: network namespaces and
iptables; needs root). Skipped, with the reason, only where the topology cannot be built."""

from __future__ import annotations

import json
import subprocess

import pytest

from .devnets import CLI, assert_network_kept_its_promises

pytestmark = pytest.mark.integration


def test_nat_homes_audit_through_relays_and_no_checkpoint_crosses_one(tmp_path):
    args = [*CLI, "devnet", "--scenario", "nat", "--workdir", str(tmp_path), "--json", "--deadline", "480"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=720)
    if proc.returncode == 1 and "the NAT topology needs root" in proc.stderr:
        pytest.skip(f"no NAT topology here: {proc.stderr.strip()[-200:]}")
    assert proc.returncode == 0, proc.stderr[-2000:] + _report(proc.stdout)
    s = json.loads(proc.stdout)
    assert_network_kept_its_promises(s)
    report = s["scenarios"]["nat"]
    detected = report["detected"]
    assert report["ok"], report["checks"]
    assert detected["checkpoints_via_relay"] == 0
    # every home node fetched its checkpoints: all from peers it reached directly
    fetched_by = {src["fetched_by"] for src in report["checkpoint_sources"]}
    assert {"a", "b"} <= fetched_by, report["checkpoint_sources"]
    assert all(not src["relayed"] for src in report["checkpoint_sources"])
    # the pairs that talked, by how they ended; home A <-> home B only through the relay or a punch
    assert sum(detected["connections"][k] for k in ("direct", "relayed", "none")) > 0
    assert sum(detected["homes_a_b"][k] for k in ("direct", "relayed")) > 0
    assert set(detected["hole_punches"]) == {"attempts", "succeeded"}
    assert detected["hole_punches"]["succeeded"] <= detected["hole_punches"]["attempts"]


def _report(stdout: str) -> str:
    try:
        return json.dumps({k: v for k, v in json.loads(stdout)["scenarios"]["nat"].items() if k != "checkpoint_sources"})
    except (ValueError, KeyError, TypeError):
        return stdout[-3000:]
