"""Time to flag a forged step ÷ time to full coverage (issue 18 target: ≤ 0.25), in a real devnet.

    .venv/bin/python bench/flag_time.py [--steps 256] [--nodes 4] [--scenario forged-data]

Runs ``open1b-node devnet --scenario forged-data`` (``--nodes`` auditors and an observer, real
daemon processes on loopback, redundancy 1): the run's step ⌊steps/2⌋ trained on other text than
it commits. Both times are measured in that one devnet, from the run's publication: *flag*, until
the observer's spot coverage shows the forged step failed; *coverage*, until the observer's replay
coverage is complete (every step verified, the forged one refuted). Both are read by polling the
observer every 0.5 s. Writes bench/results/flag_time.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

from open1b.devnet import DevnetOptions
from open1b.devnet.scenarios import run_scenarios
from open1b.devnet.scenarios.spot_base import SpotScenario
from open1b.node.config import NodeConfig

OUT = Path(__file__).parent / "results" / "flag_time.json"


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--steps", type=int, default=256)
    cli.add_argument("--nodes", type=int, default=4)
    cli.add_argument("--scenario", default="forged-data")
    cli.add_argument("--deadline", type=float, default=3600.0)
    cli.add_argument("--device", default="cpu")
    cli.add_argument("--replay-delay", type=float, default=0.0,
                     help="seconds each replay is slowed by (the scenarios' tests use 2; the bench measures the daemon as is)")
    cli.add_argument("--lanes", type=int, default=NodeConfig.spot_checks_in_flight,
                     help="spot_checks_in_flight of every auditor (written to each node's config.toml)")
    cli.add_argument("--workdir", type=Path, help="keep the devnet's directories (logs, stores) here")
    args = cli.parse_args()
    SpotScenario.replay_delay_s, SpotScenario.lanes = args.replay_delay, args.lanes
    started = time.monotonic()
    summary = run_scenarios(DevnetOptions(nodes=args.nodes, steps=args.steps, redundancy=1, deadline_s=args.deadline,
                                          scenarios=(args.scenario,), device=args.device,
                                          workdir=args.workdir, keep=args.workdir is not None))
    report = summary["scenarios"][args.scenario]
    detected = report["detected"]
    out = {
        "scenario": args.scenario, "steps": args.steps, "auditors": args.nodes, "redundancy": 1,
        "replay_delay_s": args.replay_delay,
        "forged_step": report["injected"]["step"], "caught": detected["caught"],
        "spot_failed_steps": detected["failed"],
        "flag_s": detected["flagged_s"], "coverage_s": detected["covered_s"], "published_s": detected["published_s"],
        "spot_checks_in_flight": args.lanes,
        "flag_over_coverage": detected["flag_over_coverage"], "target": 0.25,
        "spot_checked_steps_at_end": detected["spot_checked_steps"], "escape_one_forged": detected["escape_one_forged"],
        "ok": summary["ok"], "checks": report["checks"], "wall_s": round(time.monotonic() - started, 1),
        "machine": f"{platform.machine()} {platform.system()}", "date": time.strftime("%Y-%m-%d"),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
