"""Trainer benchmark (issue 8): training throughput with W = 1 and W = 4 processes, and the size
of a ``small`` run's artifacts per step.

    .venv/bin/python bench/trainer_bench.py [--tiny-steps 30] [--small-steps 3] [--rounds 2]

* throughput: tokens per second of the trainer's step loop (:func:`.distributed.run_steps`)
  for the ``tiny`` and ``small`` presets, with the preset's topology set to W ranks, as
  ``open1b-node train --ranks W`` does. W = 1 is one process; W = 4 is four gloo processes
  (rank 0 here). A W-rank step trains W times the sequences of a 1-rank step, so tokens per
  second, not steps per second, is the comparable figure. The rows marked "one-process replay"
  are the same W = 4 steps computed by one process (what an auditor's replay costs).
  The first step of every run is excluded from the timed region: it carries the workers'
  start-up (spawn, imports, kernel load from numba's cache, self-checks), reported separately
  as ``first_step_s``. The kernels are compiled in this process before any run.
* artifacts: bytes a ``small`` run writes per step — one checkpoint (safetensors of the
  parameters, both AdamW moments and the two bias-correction powers) and the manifest's three
  32-byte entries — and the time to hash and save one state.

The machine is shared with other work: configurations are interleaved over ``--rounds``, rates
are per-step medians (``best``: the fastest step), and every row records the median 1-minute
load average of its runs.
Writes bench/results/trainer.json and prints a table.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
SEED = 0
WIDTHS = (7, 3, 7, 13, 10, 11, 10, 12, 7)


def schedule(preset: str, ranks: int):
    from open1b.deterministic import PRESETS
    from open1b.deterministic.data import batch_for_step, builtin_dataset

    p = PRESETS[preset]
    topology = dataclasses.replace(p.topology, ranks=ranks)
    fn = functools.partial(batch_for_step, builtin_dataset(p.config), SEED, config=p.config, topology=topology)
    return p.config, topology, fn


def time_loop(preset: str, world: int, steps: int, processes: int) -> tuple[float, list[float]]:
    """``steps`` steps of ``preset`` with ``world`` ranks on ``processes`` processes (1 or world):
    the time to the first step's result, and each later step's duration."""
    from open1b.deterministic import init_state
    from open1b.deterministic.distributed import run_steps

    config, topology, fn = schedule(preset, world)
    start = time.perf_counter()
    marks = [time.perf_counter() for _ in run_steps(init_state(config, SEED), fn, topology, steps, world=processes)]
    return marks[0] - start, [b - a for a, b in zip(marks, marks[1:])]


def bench_loops(preset: str, steps: int, rounds: int) -> list[dict]:
    """Each configuration ``rounds`` times, interleaved, so that a change in the shared machine's
    load touches all of them; per-step medians (and the best step) over all rounds."""
    configs = ((1, 1), (4, 4), (4, 1))
    firsts: dict = {c: [] for c in configs}
    durations: dict = {c: [] for c in configs}
    loads = []
    for _ in range(rounds):
        for world, processes in configs:
            loads.append(os.getloadavg()[0])
            first, later = time_loop(preset, world, steps, processes)
            firsts[(world, processes)].append(first)
            durations[(world, processes)].extend(later)
    config = schedule(preset, 1)[0]
    rows = []
    for world, processes in configs:
        tokens_per_step = schedule(preset, world)[1].sequences * config.seq_len
        median, best = statistics.median(durations[(world, processes)]), min(durations[(world, processes)])
        rows.append({
            "preset": preset, "ranks": world, "processes": processes,
            "steps_timed": len(durations[(world, processes)]), "tokens_per_step": tokens_per_step,
            "first_step_s": round(statistics.median(firsts[(world, processes)]), 3),
            "seconds_per_step": round(median, 4), "tokens_per_s": round(tokens_per_step / median, 1),
            "best_tokens_per_s": round(tokens_per_step / best, 1),
            "load_avg_1m": round(statistics.median(loads), 2),
        })  # fmt: skip
        print(f"  {preset} W={world} on {processes} process(es): {rows[-1]['tokens_per_s']} tokens/s", file=sys.stderr)
    return rows


def bench_artifacts() -> dict:
    """One ``small`` checkpoint's file size, and the time to hash and to save one state."""
    from open1b.deterministic import PRESETS, init_state
    from open1b.deterministic.runfile import checkpoint_path, next_state_hash, save_checkpoint

    config = PRESETS["small"].config
    state = init_state(config, SEED)
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        save_checkpoint(Path(tmp), state)
        save_s = time.perf_counter() - t
        size = checkpoint_path(Path(tmp), state.step).stat().st_size
    t = time.perf_counter()
    next_state_hash(bytes(32), state, None)
    hash_s = time.perf_counter() - t
    manifest = 3 * 32  # state hash, checkpoint address, witness commitment
    return {
        "preset": "small", "n_params": config.n_params(), "checkpoint_bytes": size,
        "tensor_bytes": 4 * (3 * config.n_params() + 2), "manifest_bytes": manifest,
        "bytes_per_step": size + manifest, "save_checkpoint_s": round(save_s, 3), "state_hash_s": round(hash_s, 3),
    }  # fmt: skip


def warm_up(presets) -> None:
    # Compile (or load) every kernel both presets use, outside any timed region.
    from open1b.deterministic import init_state, train_step

    for preset in presets:
        config, topology, fn = schedule(preset, 1)
        train_step(init_state(config, SEED), fn(0), topology)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny-steps", type=int, default=30)
    ap.add_argument("--small-steps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2, help="runs of each configuration, interleaved")
    args = ap.parse_args(argv)
    if min(args.tiny_steps, args.small_steps) < 2:
        ap.error("at least 2 steps per run (the first is not timed)")
    warm_up(("tiny", "small"))
    runs = []
    for preset, steps in (("tiny", args.tiny_steps), ("small", args.small_steps)):
        runs.extend(bench_loops(preset, steps, args.rounds))
    artifacts = bench_artifacts()
    out = {
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "runs": runs,
        "artifacts": artifacts,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "trainer.json").write_text(json.dumps(out, indent=2) + "\n")
    header = ("preset", "W", "procs", "tokens/step", "s/step", "tokens/s", "best", "1st step s", "load")
    print("".join(f"{h:<7}" if i == 0 else f"{h:>{w}}" for i, (h, w) in enumerate(zip(header, WIDTHS))))
    for r in runs:
        label = "" if r["processes"] == r["ranks"] else "  (one-process replay)"
        cells = (r["ranks"], r["processes"], r["tokens_per_step"], r["seconds_per_step"], r["tokens_per_s"],
                 r["best_tokens_per_s"], r["first_step_s"], r["load_avg_1m"])  # fmt: skip
        print(f"{r['preset']:<7}" + "".join(f"{c:>{w}}" for c, w in zip(cells, WIDTHS[1:])) + label)
    a = artifacts
    print(f"small run artifacts per step: {a['bytes_per_step']:,} bytes (checkpoint {a['checkpoint_bytes']:,}"
          f" = tensors {a['tensor_bytes']:,} + header; manifest {a['manifest_bytes']});"
          f" save {a['save_checkpoint_s']} s, state hash {a['state_hash_s']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
