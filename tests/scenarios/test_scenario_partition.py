"""Devnet scenario: a real network partition (two Linux network namespaces)."""

from __future__ import annotations

import json
import subprocess

import pytest

from open1b.devnet.scenarios.partition import Partition

from .devnets import CLI, assert_network_kept_its_promises

pytestmark = pytest.mark.integration


# -- partition -----------------------------------------------------------------------------------
def test_partition_both_halves_keep_working_and_converge_after_healing(tmp_path):
    # No --steps: the scenario asks for the run it needs (Partition.min_steps)
    args = [*CLI, "devnet", "--scenario", "partition", "--workdir", str(tmp_path), "--json", "--deadline", "660"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=960)
    if proc.returncode == 1 and "network namespaces" in proc.stderr:
        pytest.skip(f"no network namespaces here: {proc.stderr.strip()[-200:]}")
    assert proc.returncode == 0, proc.stderr[-2000:] + _report(proc.stdout)
    s = json.loads(proc.stdout)
    assert_network_kept_its_promises(s)
    report = s["scenarios"]["partition"]
    assert report["injected"]["halves"] == [3, 3]
    # The split came while the run was still being covered: else it tests nothing.
    assert s["steps"] == Partition.min_steps
    assert report["injected"]["verified_steps_at_split"] < s["steps"]
    assert all(made >= Partition.MIN_MADE or alone for made, alone in zip(report["detected"]["attestations_made_per_half"],
                                                       report["detected"]["halves_complete_alone"]))
    # when each half's attestations reached its observer while split, the first as its own figure
    detected = report["detected"]
    assert [len(t) for t in detected["attestations_after_split_s"]] == detected["attestations_made_per_half"]
    assert detected["first_attestation_after_split_s"] == [t[0] if t else None for t in detected["attestations_after_split_s"]]
    assert all(0 <= t <= report["injected"]["split_seconds"] + 1 for ts in detected["attestations_after_split_s"] for t in ts)
    assert report["checks"]["identical coverage after healing"]


def _report(stdout: str) -> str:
    """The scenario's report, which says which check failed (stderr says only what happened when)."""
    try:
        return json.dumps(json.loads(stdout)["scenarios"]["partition"])
    except (ValueError, KeyError, TypeError):
        return stdout[-3000:]
