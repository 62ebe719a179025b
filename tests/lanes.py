"""``./dev test`` with no paths: the suite in two lanes, so CI answers in minutes.

1. **unit**: every test not marked ``integration`` (no daemon process: tests/conftest.py fails a test
   that starts one without the mark);
2. **integration**: real daemons, devnets and scenarios.

A lane that fails, or collects no test (pytest's exit 5), fails the run.

Both lanes always run (one CI run reports every failure). Each lane's full pytest output, with its
slowest tests (``--durations``), is saved under ``artifacts/lanes/`` and printed; the last line sums
both lanes as ``N passed, M failed[, K skipped]``. Options given to ``./dev test`` (``-q``, ``-x`` …)
are passed to both lanes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LANES = (("unit", "not integration"), ("integration", "integration"))


def run_lane(name: str, marker: str, options: list[str], out: Path) -> tuple[int, dict[str, int], float]:
    junit = out / f"{name}.xml"
    log = out / f"{name}.log"
    command = [sys.executable, "-m", "pytest", "-m", marker, "--durations=25", f"--junitxml={junit}", *options]
    print(f"== lane {name}: {' '.join(command[1:])}", flush=True)
    started = time.monotonic()
    with log.open("w") as sink, subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                  text=True) as proc:
        for line in proc.stdout:
            sys.stdout.write(line)
            sink.write(line)
    wall = time.monotonic() - started
    return proc.returncode, counts(junit), wall


def counts(junit: Path) -> dict[str, int]:
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    if not junit.exists():
        return totals
    for suite in ET.parse(junit).getroot().iter("testsuite"):
        for key in totals:
            totals[key] += int(suite.get(key, 0))
    return totals


def main(options: list[str]) -> int:
    out = Path(os.environ.get("OPEN1B_LANES", ROOT / "artifacts" / "lanes"))
    out.mkdir(parents=True, exist_ok=True)
    worst = 0
    passed = failed = skipped = 0
    summary = []
    for name, marker in LANES:
        code, c, wall = run_lane(name, marker, options, out)
        lane_failed = c["failures"] + c["errors"]
        lane_passed = c["tests"] - lane_failed - c["skipped"]
        passed, failed, skipped = passed + lane_passed, failed + lane_failed, skipped + c["skipped"]
        worst = worst if code == 0 else max(worst, code)
        summary.append(f"lane {name}: {lane_passed} passed, {lane_failed} failed, {c['skipped']} skipped "
                       f"in {wall:.0f} s (exit {code}; log {out / (name + '.log')})")
    print("\n".join(summary))
    tail = f", {skipped} skipped" if skipped else ""
    print(f"{passed} passed, {failed} failed{tail}")
    return worst


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
