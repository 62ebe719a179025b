"""State-hash throughput (issue 8): the v2 tree hash on all cores vs one core's plain BLAKE2b.

    .venv/bin/python bench/hash_bench.py [--repeats 7] [--preset small]

The state has the preset's shapes — every parameter, both AdamW moments and the two
bias-correction scalars, float32 (``small``: 119 tensors, ~130 MB) — filled with random bytes
(the hash does not look at values). Timed, alternately so that a change in the machine's load
affects all alike:

* ``plain``: ``hashlib.blake2b`` of the same bytes as one contiguous buffer, on one core — the
  cheapest possible hash of the state, and the baseline;
* ``tree, 1 worker``: ``state_hash(..., workers=1)`` — the tree's own cost (chunk tags, Merkle
  nodes, Python per chunk) without parallelism;
* ``tree, all cores``: ``state_hash(...)`` with its default, one thread per core.

``speedup`` is plain's median time / the variant's median time, measured in the same run; the
same from the fastest runs (``best``) shows what the cores give when no other process takes one,
which on a shared 2-core machine the median may not. Writes bench/results/hash.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

from open1b.deterministic.config import PRESETS
from open1b.protocol import TensorBytes, state_hash

RESULTS = Path(__file__).parent / "results"


def state_of(preset: str) -> tuple[bytes, dict[str, TensorBytes]]:
    """One contiguous random buffer and the state's tensors as views into it, so that the plain
    hash and the tree hash read exactly the same bytes."""
    shapes = {}
    for name, shape in PRESETS[preset].config.param_shapes().items():
        for group in ("param", "adam_m", "adam_v"):
            shapes[f"{group}/{name}"] = shape
    shapes["adam/beta1_pow"] = shapes["adam/beta2_pow"] = ()
    sizes = {n: 4 * _count(s) for n, s in shapes.items()}
    buf = os.urandom(sum(sizes.values()))
    view, tensors, at = memoryview(buf), {}, 0
    for name, shape in shapes.items():
        tensors[name] = TensorBytes("float32", shape, view[at:at + sizes[name]])
        at += sizes[name]
    return buf, tensors


def _count(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def measure(fns: dict, repeats: int) -> dict[str, dict[str, list[float]]]:
    """Wall and process-CPU seconds of each function, round-robin after one warm-up call each."""
    for fn in fns.values():
        fn()
    out = {name: {"wall": [], "cpu": []} for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            w, c = time.perf_counter(), time.process_time()
            fn()
            out[name]["cpu"].append(time.process_time() - c)
            out[name]["wall"].append(time.perf_counter() - w)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--preset", default="small")
    args = ap.parse_args()

    buf, tensors = state_of(args.preset)
    prev = bytes(32)
    cores = os.cpu_count() or 1
    load_before = os.getloadavg()[0]
    times = measure({
        "plain": lambda: hashlib.blake2b(buf, digest_size=32).digest(),
        "tree, 1 worker": lambda: state_hash(prev, 1, tensors, prev, lr_bits=0, workers=1),
        f"tree, all cores ({cores})": lambda: state_hash(prev, 1, tensors, prev, lr_bits=0),
    }, args.repeats)
    assert state_hash(prev, 1, tensors, prev, lr_bits=0, workers=1) == state_hash(prev, 1, tensors, prev, lr_bits=0)

    plain, plain_best = statistics.median(times["plain"]["wall"]), min(times["plain"]["wall"])
    rows = {}
    for name, t in times.items():
        wall, best, cpu = statistics.median(t["wall"]), min(t["wall"]), statistics.median(t["cpu"])
        rows[name] = {"median_s": wall, "gb_per_s": len(buf) / wall / 1e9, "speedup_vs_plain": plain / wall,
                      "best_s": best, "best_gb_per_s": len(buf) / best / 1e9,
                      "best_speedup_vs_plain": plain_best / best,
                      "cpu_per_wall": cpu / wall, "wall_s": t["wall"], "cpu_s": t["cpu"]}

    print(f"state: preset {args.preset}, {len(tensors)} tensors, {len(buf) / 1e6:.1f} MB; {cores} cores; "
          f"median of {args.repeats}; load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
    print(f"{'':24} {'median s':>9} {'GB/s':>7} {'vs plain':>9} {'best GB/s':>10} {'vs plain':>9}"
          f" {'cpu/wall':>9}")
    for name, r in rows.items():
        print(f"{name:24} {r['median_s']:9.3f} {r['gb_per_s']:7.2f} {r['speedup_vs_plain']:8.2f}x"
              f" {r['best_gb_per_s']:10.2f} {r['best_speedup_vs_plain']:8.2f}x {r['cpu_per_wall']:9.2f}")

    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "hash.json").write_text(json.dumps({
        "preset": args.preset, "tensors": len(tensors), "bytes": len(buf), "repeats": args.repeats,
        "results": rows, "machine": {"cpu_count": cores, "python": sys.version.split()[0],
                                     "load_average_1m": [load_before, os.getloadavg()[0]]},
    }, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
