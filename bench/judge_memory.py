"""Memory and time of judging a large fraud proof (issue 28): the referee on a 67.3 MB proof of
``x @ W`` that carries a whole 64 MiB state weight (`gpt-1b`'s `mlp_fc` shape, 2048 x 8192, with 8
rows of ``x``: the serial kernel computes it in a second), and the strict decode alone of a 64 MiB
byte string. Each is measured in a fresh process with its input read beforehand: the peak resident
set over that baseline (VmHWM after a reset through ``/proc/self/clear_refs``, Linux), Python's
tracemalloc peak, and the median CPU time of this thread over 5 runs after a warm one.

    .venv/bin/python bench/judge_memory.py [--workdir DIR]

Writes bench/results/judge_memory.json. Before the canonical check compared in place
(protocol/codec.py) judging peaked at 192.3 MiB over the body, and the decode at 191.9 MiB:
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _build(path: Path) -> None:
    import numpy as np

    from open1b.deterministic import matmul
    from open1b.protocol import Identity
    from tests.protocol.dispute_cases import traces_around

    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 2048)).astype(np.float32)
    w = (rng.standard_normal((2048, 8192)) * 0.02).astype(np.float32)
    out = matmul.MATMUL[False](x[None], w[None], False, False, 0)[0]
    proof = traces_around("matmul", [x, w], {"trans_a": 0, "trans_b": 0, "structure": 0}, [out],
                          (Identity(b"\x01" * 32), Identity(b"\x02" * 32)), forge_element=out.size // 2,
                          state_inputs=frozenset({1}))
    path.write_bytes(proof.encode())


def _kib(key: str) -> int:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(key + ":"))
    return int(line.split()[1])


def _measure(what: str, proof: Path) -> dict:
    from open1b.protocol import Identity, codec
    from open1b.protocol.dispute.referee import verify_fraud_proof

    if what == "judge":
        data = proof.read_bytes()
        assert verify_fraud_proof(data).guilty == (Identity(b"\x02" * 32).public_key,)  # the forger alone

        def run() -> None:
            verify_fraud_proof(data)
    else:
        data = codec.encode(b"\x01" * (64 << 20))

        def run() -> None:
            codec.decode(data, max_size=len(data))
    run()
    times = []
    for _ in range(5):
        start = time.thread_time()
        run()
        times.append(time.thread_time() - start)
    before = _kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM starts again from here
    run()
    rss = _kib("VmHWM") - before
    tracemalloc.start()
    run()
    traced = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {"input_bytes": len(data), "peak_rss_over_input_mib": rss / 1024, "tracemalloc_peak_mib": traced / 2**20,
            "cpu_s_median": statistics.median(times)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, help="where the proof is written (default: a temporary directory)")
    parser.add_argument("--part", choices=["build", "judge", "decode"], help=argparse.SUPPRESS)  # a child's
    parser.add_argument("--proof", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.part == "build":
        _build(args.proof)
        return 0
    if args.part:
        print(json.dumps(_measure(args.part, args.proof)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        proof = (args.workdir or Path(tmp)) / "proof.cbor"

        def child(part: str) -> str:
            return subprocess.run([sys.executable, __file__, "--part", part, "--proof", str(proof)], check=True,
                                  capture_output=True, text=True).stdout

        child("build")
        result = {"judge_x_at_w_64mib": json.loads(child("judge")), "decode_64mib_bytes": json.loads(child("decode"))}
    result["load_average_1m"], result["date"] = os.getloadavg()[0], time.strftime("%Y-%m-%d")
    print(json.dumps(result, indent=1))
    (ROOT / "bench" / "results" / "judge_memory.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
