"""A longer fuzzing run than CI's: every property of tests/fuzz/ with many more examples, over
several seeds.

    .venv/bin/python bench/fuzz_long.py [--examples 20000] [--seeds 3]

CI runs the same properties with OPEN1B_FUZZ_EXAMPLES=200 (tests/fuzz/budget.py). A failure
prints hypothesis' minimal example and the seed to replay it with
``pytest tests/fuzz --hypothesis-seed=SEED``. Writes bench/results/fuzz.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "fuzz.json"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--examples", type=int, default=20000, help="examples per property and seed")
    p.add_argument("--seeds", type=int, default=3)
    args = p.parse_args()
    runs = []
    for seed in range(1, args.seeds + 1):
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/fuzz",
                               f"--hypothesis-seed={seed}"], cwd=ROOT, capture_output=True, text=True,
                              env={**os.environ, "OPEN1B_FUZZ_EXAMPLES": str(args.examples)})
        tail = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
        runs.append({"seed": seed, "examples_per_property": args.examples, "passed": proc.returncode == 0,
                     "summary": tail, "seconds": round(time.monotonic() - started, 1)})
        print(f"fuzz: seed {seed}: {tail}", file=sys.stderr, flush=True)
        if proc.returncode != 0:
            print(proc.stdout[-6000:], file=sys.stderr)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"runs": runs}, indent=1) + "\n")
    return 0 if all(r["passed"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
