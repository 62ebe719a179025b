"""Devnet scenario: a real network partition (two Linux network namespaces)."""

from __future__ import annotations

import json
import subprocess

import pytest

from .devnets import CLI, assert_network_kept_its_promises

pytestmark = pytest.mark.integration


# -- partition -----------------------------------------------------------------------------------
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
