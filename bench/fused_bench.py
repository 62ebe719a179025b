"""Fused epilogues vs the separate ops (issue 32): one training step with the residual adds, GELU
and its backward in the products' epilogues (deterministic/epilogue.py), against the same step
with every op apart, in the same run, alternating.

    .venv/bin/python bench/fused_bench.py [--preset small] [--repeats 7] [--threads 1]

``ratio`` = fused ÷ unfused step time (medians; < 1 means fusion is faster). With one thread the
serial kernels run and are timed by this thread's CPU clock (other processes on the machine
barely move it); with more, the parallel kernels by the wall clock. The two steps' states and
witnesses are compared first: the run fails if any bit differs. Compile time is outside the timed
region (each path runs once before timing). Writes bench/results/fused-<threads>t.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from engine_bench import timed_pair  # noqa: E402

RESULTS = Path(__file__).parent / "results"


def measure(preset_name: str, repeats: int, threads: int) -> dict:
    import numba

    from open1b.deterministic import PRESETS, batch_for_step, builtin_dataset, init_state, train_step
    from open1b.deterministic.backend import cpu_backend
    from open1b.deterministic.selfcheck import state_fingerprint

    numba.set_num_threads(threads)
    preset = PRESETS[preset_name]
    config, topology = preset.config, preset.topology
    state = init_state(config, 0)
    batch = batch_for_step(builtin_dataset(config), 0, 0, config, topology)
    fused, unfused = cpu_backend(threads > 1, fused=True), cpu_backend(threads > 1, fused=False)
    results = {name: train_step(state, batch, topology, backend=be) for name, be in (("fused", fused),
                                                                                      ("unfused", unfused))}  # fmt: skip
    same = {name: (state_fingerprint(s), r.witness) for name, (s, r) in results.items()}
    if same["fused"] != same["unfused"]:
        raise SystemExit("fused and unfused steps differ: fusion changed a bit")
    clock = time.thread_time if threads == 1 else time.perf_counter
    a, b = timed_pair(lambda: train_step(state, batch, topology, backend=fused),
                      lambda: train_step(state, batch, topology, backend=unfused), repeats, clock)  # fmt: skip
    return {"preset": preset_name, "threads": threads, "backend": fused.name, "repeats": repeats,
            "clock": "thread CPU time" if threads == 1 else "wall", "same_bits": True,
            "fused_s": statistics.median(a), "unfused_s": statistics.median(b),
            "ratio": statistics.median(a) / statistics.median(b), "fused_all_s": a, "unfused_all_s": b}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    out = measure(args.preset, args.repeats, args.threads)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"fused-{args.threads}t.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({k: v for k, v in out.items() if not k.endswith("_all_s")}, indent=2))


if __name__ == "__main__":
    main()
