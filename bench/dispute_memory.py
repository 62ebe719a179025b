"""The daemon's memory while it holds a dispute's op data (issue 28, node/op_data.py): a 2-step
`small` run, its step 1 traced by a real replay worker (the daemon's ``WorkerTracer``), then the
op data of the op with the most bytes fetched and used as a dispute uses it (the chunk tree of
each output and input: what the chunk descent and the proof's openings read). The daemon's peak
resident set over its baseline is VmHWM after a reset through ``/proc/self/clear_refs`` (Linux),
with the op's bytes beside it.

    .venv/bin/python bench/dispute_memory.py [--workdir DIR]

Writes bench/results/dispute_memory.json. Before the op data went to disk the daemon's peak rose
by about twice the op's bytes (the file, then the decoded bytes): docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import trio

from open1b.deterministic.trainer import publish_run
from open1b.node.dispute_tracer import WorkerTracer
from open1b.node.op_data import OpFiles
from open1b.node.worker import ReplayWorker
from open1b.protocol import Identity
from open1b.protocol.dispute.trace import chunk_tree, nbytes, state_output

ROOT = Path(__file__).resolve().parent.parent


def _kib(key: str) -> int:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(key + ":"))
    return int(line.split()[1])


async def _measure(run_dir: Path, manifest, scratch: Path) -> dict:
    worker = ReplayWorker("cpu")
    try:
        tracer = WorkerTracer(worker, scratch, 3600, OpFiles(scratch / "disputes"))
        traced = await tracer.trace(manifest, run_dir, 1)

        def size(record: dict) -> int:
            return sum(nbytes(t["dtype"], t["shape"]) for t in record["inputs"] + record["outputs"])

        record = max(traced.records, key=size)
        before = _kib("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM starts again from here
        data = await tracer.op_data(manifest, run_dir, 1, record["pos"])
        try:
            for t in data.outputs:
                chunk_tree(t, state=state_output(record["kind"]))
            for given, entry in zip(data.inputs, record["inputs"]):
                chunk_tree(given.data, state="state" in entry)
            peak = _kib("VmHWM")
        finally:
            data.close()
        return {"op": record["kind"], "position": record["pos"], "op_bytes": size(record),
                "daemon_rss_kib": before, "daemon_peak_over_rss_kib": peak - before}
    finally:
        await worker.aclose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, help="where the run is written (default: a temporary directory)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.workdir or Path(tmp)
        run_dir = workdir / "run"
        manifest = publish_run(run_dir, Identity(b"\x05" * 32), steps=2, preset="small")
        result = trio.run(_measure, run_dir, manifest, workdir / "scratch")
    result["load_average_1m"], result["date"] = os.getloadavg()[0], time.strftime("%Y-%m-%d")
    print(json.dumps(result, indent=1))
    (ROOT / "bench" / "results" / "dispute_memory.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
