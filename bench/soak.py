"""Soak: keep running devnet scenarios — alone and combined, with more nodes and steps than CI —
until a time budget is spent, and count what failed.

    .venv/bin/python bench/soak.py [--minutes 30] [--nodes 6] [--steps 16]

Each round runs every scenario set below once; a set that fails keeps its workdir (listed in the
output) for the daemons' logs. Writes bench/results/soak.json. CI runs each scenario once on a
small devnet (tests/scenarios/); this is where rarer failures show up.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from open1b.devnet import DevnetOptions, run_devnet

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "soak.json"

SETS = [
    ("tampered-step", "lying-auditor", "late-joiner"),
    ("forged-and-malformed", "sybil"),
    ("crash",),
    ("partition",),
    ("tampered-step", "crash"),
    ("lying-auditor", "forged-and-malformed", "sybil", "late-joiner"),
]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--nodes", type=int, default=6)
    p.add_argument("--steps", type=int, default=16)
    args = p.parse_args()
    end = time.monotonic() + args.minutes * 60
    rows = []
    while time.monotonic() < end:
        for scenarios in SETS:
            if time.monotonic() >= end:
                break
            workdir = Path(tempfile.mkdtemp(prefix="open1b-soak-"))
            opts = DevnetOptions(nodes=args.nodes, steps=args.steps, scenarios=scenarios, workdir=workdir,
                                 deadline_s=600.0)
            try:
                summary = run_devnet(opts)
                failed = [n for n, r in summary["scenarios"].items() if not r["ok"]]
                row = {"scenarios": scenarios, "ok": summary["ok"], "failed": failed, "lost": summary["lost"],
                       "converged": summary["converged"], "wall_seconds": summary["wall_seconds"]}
            except Exception as exc:
                row = {"scenarios": scenarios, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
            if row["ok"]:
                shutil.rmtree(workdir, ignore_errors=True)
            else:
                row["workdir"] = str(workdir)
            rows.append(row)
            print(f"soak: {'+'.join(scenarios)}: {'ok' if row['ok'] else 'FAILED ' + json.dumps(row)}",
                  file=sys.stderr, flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"nodes": args.nodes, "steps": args.steps, "runs": rows}, indent=1) + "\n")
    bad = [r for r in rows if not r["ok"]]
    print(f"soak: {len(rows) - len(bad)}/{len(rows)} sets passed", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
