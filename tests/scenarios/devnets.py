"""Driving a devnet with scenarios from the tests (``open1b-node devnet --scenario``).

The scenario tests are split over several files so that the suite's two workers (each file whole
on one) share them out. Scenarios that do not disturb each other share one devnet (they combine,
as the CLI allows); the copier among liars, crash, partition and the refusing trainer each get
their own. The devnet reports what it injected and detected, but the tests re-check what matters
themselves: the signed evidence is decoded and verified against the published manifest, and
coverage is read from the daemons' summary rather than from the scenario's verdicts alone.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from open1b.deterministic.runfile import read_manifest

CLI = [sys.executable, "-m", "open1b.node.cli"]
DEADLINE_S = 480

def devnet(workdir: Path, *scenarios: str, steps: int = 8, nodes: int | None = None,
           redundancy: int | None = None) -> dict:
    args = [a for s in scenarios for a in ("--scenario", s)] + (["--nodes", str(nodes)] if nodes else [])
    args += ["--redundancy", str(redundancy)] if redundancy else []
    proc = subprocess.run([*CLI, "devnet", *args, "--steps", str(steps), "--workdir", str(workdir), "--json",
                           "--deadline", str(DEADLINE_S)], capture_output=True, text=True, timeout=900)
    # Exit 2 is a devnet that is not ok: a scenario's check failed (each test asserts the checks it
    # means), or the deadline passed. A deadline passed always fails the test, with what the devnet
    # was still waiting for: the devnet's summary is then taken at an arbitrary moment, and a test
    # that passes on it would pass however long the network took, or if it never finished.
    assert proc.returncode in (0, 2), proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert not summary["waiting_for"], (f"the devnet passed its deadline ({DEADLINE_S} s), still waiting for: "
                                        f"{'; '.join(summary['waiting_for'])}; workdir {workdir}")
    summary["manifest"] = read_manifest(workdir / "run")
    summary["returncode"] = proc.returncode
    return summary


def peers(summary: dict, *roles: str) -> set[str]:
    return {n["peer_id"] for n in summary["per_node"] if n["role"] in roles}


def assert_network_kept_its_promises(summary: dict) -> None:
    assert summary["complete"], "the observer's coverage did not complete"
    assert summary["converged"], "honest nodes ended with different coverage"
    assert summary["lost"] == 0
