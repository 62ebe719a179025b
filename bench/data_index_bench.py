"""The draw index of a long run (issue 19): build time, size and query time, against the cost of
re-deriving every draw (what a verifier of a never-drawn proof pays).

    .venv/bin/python bench/data_index_bench.py [--steps 80957] [--repeats 5]

The run is synthetic — a seed, S steps of the ``tiny`` topology (2 × 2 × 2 rows) and the N of the
shipped corpus cut for ``tiny`` — since the index depends on nothing else. Timed (median of
``--repeats``): building the index, encoding it, loading it back (with its checks), a query for a
typical document (3 samples) and for a long one (200 samples), and ``draws_between`` over the
whole run (the baseline: what answering without an index costs). Writes
bench/results/data_index.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from open1b.deterministic.config import PRESETS
from open1b.deterministic.data_index import DrawIndex
from open1b.protocol.data_order import draws_between

RESULTS = Path(__file__).parent / "results"
SAMPLES = 31_244  # the shipped corpus cut for `tiny` (docs/run-format.md §4.4)


def timed(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=80_957)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    t = PRESETS["tiny"].topology
    topology = (t.ranks, t.micro_batches, t.micro_batch_size)
    key = dict(run=bytes(32), seed=5, steps=args.steps, topology=topology, samples=SAMPLES)
    build, index = timed(lambda: DrawIndex.build(**key), args.repeats)
    encode, data = timed(index.encode, args.repeats)
    load, _ = timed(lambda: DrawIndex.decode(data, **key), args.repeats)
    short, hits = timed(lambda: index.draws(1000, 1003), args.repeats)
    long, long_hits = timed(lambda: index.draws(1000, 1200), args.repeats)
    rederive, same = timed(lambda: draws_between(5, range(args.steps), *topology, SAMPLES, 1000, 1003), args.repeats)
    assert same == hits
    result = {
        "steps": args.steps, "rows": args.steps * t.sequences, "samples": SAMPLES, "repeats": args.repeats,
        "build_s": build, "encode_s": encode, "load_s": load, "size_bytes": len(data),
        "query_3_samples_s": short, "query_3_samples_draws": len(hits),
        "query_200_samples_s": long, "query_200_samples_draws": len(long_hits),
        "rederive_all_draws_s": rederive, "speedup_query_vs_rederive": rederive / short,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "data_index.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
