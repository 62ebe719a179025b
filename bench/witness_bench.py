"""The replay witness's share of a training step (issue 32): rule v2 (chunk tree, every core) vs
rule v1 (one sequential hash), each against the step measured in the same run.

    .venv/bin/python bench/witness_bench.py [--repeats 9] [--preset small] [--one-thread]

On one ``small`` step of the CPU backend (state 0, batch of step 0), timed round-robin so that a
change in the machine's load affects every row alike:

* ``step, witness v2`` / ``step, witness v1``: a whole ``train_step`` hashing its witness by that
  rule (in the background, overlapping the update, as every step does);
* ``witness v2, all cores`` / ``witness v2, 1 worker`` / ``witness v1``: the witness alone, from
  that step's real loss and gradients (``replay_witness``), on the engine's per-process chunk
  pool, on one thread, and by the sequential rule;
* ``witness v2, critical path``: v2 on a pool of one thread per core that adds up the CPU time
  each thread spends in chunk jobs; its "time" is the calling thread's CPU time (tags, tensor
  digests, Merkle nodes) plus the busiest thread's — the wall time on that many free cores,
  measured by CPU clocks, which other processes on a shared machine barely disturb.

``share_of_step`` is a witness row's median wall time ÷ the median wall time of the step with
that rule (the witness's latency beside the step's); ``cpu_share_of_step`` the same by process
CPU time (its work: what it takes from a machine whose cores the step keeps busy, and a ratio
that the load of other processes disturbs much less). ``step_v2_vs_v1`` is the v2 step's median ÷
the v1 step's (below 1: the step got faster). The step runs on the preset's default CPU backend
(``small``: numba's parallel kernels on every core), or on one thread with ``--one-thread``.
Compile time is kept out (every function runs once before timing). Writes
bench/results/witness.json (``--one-thread``: witness-one-thread.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from hash_bench import measure

from open1b.deterministic import PRESETS, batch_for_step, builtin_dataset, init_state, train_step
from open1b.deterministic.backend import cpu_backend, default_backend
from open1b.deterministic.step import step_gradients
from open1b.deterministic.witness import replay_witness
from open1b.protocol import TensorBytes
from open1b.protocol.witness import WITNESS_SEQUENTIAL, WITNESS_TREE, tree_witness

RESULTS = Path(__file__).parent / "results"


class CpuTimedPool(ThreadPoolExecutor):
    """A thread pool that adds up, per thread, the CPU time its jobs take."""

    def __init__(self, workers: int) -> None:
        super().__init__(workers)
        self.cpu: Counter = Counter()

    def submit(self, fn, /, *args, **kwargs):
        def timed():
            start = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.cpu[threading.get_ident()] += time.thread_time() - start

        return super().submit(timed)


def critical_path(loss_bits: int, tensors: dict, pool: CpuTimedPool) -> float:
    """CPU seconds of v2's critical path on ``pool``: this thread's part plus the busiest worker's."""
    pool.cpu.clear()
    start = time.thread_time()
    tree_witness(loss_bits, tensors, workers=pool)
    return time.thread_time() - start + max(pool.cpu.values())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--one-thread", action="store_true", help="the step's kernels on one thread")
    args = ap.parse_args()

    preset = PRESETS[args.preset]
    config, topology = preset.config, preset.topology
    state = init_state(config, 0)
    batch = batch_for_step(builtin_dataset(config), 0, 0, config, topology)
    be = cpu_backend(False) if args.one_thread else default_backend(config)
    loss, grads = step_gradients(state, batch, topology, be)
    loss, order = np.float32(loss[0]), list(config.param_shapes())
    grads = {name: np.asarray(be.download(grads[name]), np.float32) for name in order}
    tensors = {n: TensorBytes("float32", g.shape, memoryview(g.reshape(-1)).cast("B")) for n, g in grads.items()}
    loss_bits = int(loss.view(np.uint32))
    nbytes = sum(g.nbytes for g in grads.values())
    cores = os.cpu_count() or 1
    with ThreadPoolExecutor(1) as one:
        assert tree_witness(loss_bits, tensors, workers=one) == replay_witness(loss, grads, order, WITNESS_TREE)
        load_before = os.getloadavg()[0]
        times = measure({
            "step, witness v2": lambda: train_step(state, batch, topology, backend=be)[1].witness,
            "step, witness v1": lambda: train_step(state, batch, topology, backend=be,
                                                   witness_rule=WITNESS_SEQUENTIAL)[1].witness,
            f"witness v2, all cores ({cores})": lambda: replay_witness(loss, grads, order, WITNESS_TREE),
            "witness v2, 1 worker": lambda: tree_witness(loss_bits, tensors, workers=one),
            "witness v1": lambda: replay_witness(loss, grads, order, WITNESS_SEQUENTIAL),
        }, args.repeats)
        load_after = os.getloadavg()[0]
    with CpuTimedPool(cores) as pool:
        paths = [critical_path(loss_bits, tensors, pool) for _ in range(args.repeats + 1)][1:]

    med = {name: statistics.median(t["wall"]) for name, t in times.items()}
    cpu = {name: statistics.median(t["cpu"]) for name, t in times.items()}
    step = {"v2": med["step, witness v2"], "v1": med["step, witness v1"]}
    rows = {}
    for name, t in times.items():
        row = {"median_s": med[name], "best_s": min(t["wall"]), "cpu_median_s": cpu[name],
               "wall_s": t["wall"], "cpu_s": t["cpu"]}
        if name.startswith("witness"):
            rule = "v1" if name == "witness v1" else "v2"
            row |= {"gb_per_s": nbytes / med[name] / 1e9, "share_of_step": med[name] / step[rule],
                    "cpu_share_of_step": cpu[name] / cpu[f"step, witness {rule}"]}
        rows[name] = row

    print(f"preset {args.preset}: {len(order)} gradients, {nbytes / 1e6:.1f} MB; {cores} cores; median of "
          f"{args.repeats}; load average {load_before:.2f} before, {load_after:.2f} after")
    for name, r in rows.items():
        extra = (f" {r['gb_per_s']:6.2f} GB/s  {100 * r['share_of_step']:5.1f}% of the step, by CPU time"
                 f" {100 * r['cpu_share_of_step']:5.1f}%") if "gb_per_s" in r else ""
        print(f"{name:26} {r['median_s'] * 1e3:8.1f} ms (best {r['best_s'] * 1e3:7.1f}, CPU {r['cpu_median_s'] * 1e3:7.1f})"
              f"{extra}")
    path = statistics.median(paths)
    rows[f"witness v2, critical path on {cores} cores (CPU clocks)"] = {
        "median_s": path, "best_s": min(paths), "cpu_s": paths, "gb_per_s": nbytes / path / 1e9,
        "share_of_step_cpu": path / cpu["step, witness v2"]}
    print(f"witness v2, critical path on {cores} cores: {path * 1e3:.1f} ms by CPU clocks (best {min(paths) * 1e3:.1f}),"
          f" {nbytes / path / 1e9:.2f} GB/s, {100 * path / cpu['step, witness v2']:.1f}% of the step's CPU time")
    print(f"step with v2 / step with v1: {step['v2'] / step['v1']:.3f}")

    RESULTS.mkdir(exist_ok=True)
    (RESULTS / ("witness-one-thread.json" if args.one_thread else "witness.json")).write_text(json.dumps({
        "preset": args.preset, "gradients": len(order), "bytes": nbytes, "repeats": args.repeats,
        "step_backend": "one thread" if args.one_thread else "default",
        "step_v2_vs_v1": step["v2"] / step["v1"], "results": rows,
        "machine": {"cpu_count": cores, "python": sys.version.split()[0], "load_average_1m": [load_before, load_after]},
    }, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
