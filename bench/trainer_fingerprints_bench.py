"""What recording fingerprints costs the trainer end to end, and what the run-directory spot-check
interface costs, each as a ratio to a baseline measured in the same run (issue 18).

    .venv/bin/python bench/trainer_fingerprints_bench.py [--rounds 3] [--steps 4] [--presets tiny small]

* ``train_overhead``: ``publish_run(fingerprints=True)`` ÷ ``publish_run(fingerprints=False)`` − 1,
  whole runs (training, state hashing, checkpoint writes, the fingerprints file), interleaved, in
  CPU time of this process (all its threads): on a machine shared with other work, wall time
  swung from −18% to +28% between runs of this benchmark, CPU time measures the work itself.
* ``check_over_replay``: :func:`.spot_run.check_spot` with the trainer's answer ÷
  :func:`.replay.replay` of the same step (both read and verify their checkpoints and samples).
* ``answer_over_replay``: :func:`.spot_run.answer_from_run` ÷ :func:`.replay.replay`.

Medians over ``--rounds`` on a shared machine. Writes bench/results/trainer_fingerprints.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from open1b.deterministic.replay import replay
from open1b.deterministic.runfile import read_manifest
from open1b.deterministic.spot_run import answer_from_run, check_spot
from open1b.deterministic.trainer import publish_run
from open1b.protocol import Identity, blake2b256, challenge_signature, slot_signature

RESULTS = Path(__file__).parent / "results"
TRAINER, VERIFIER = Identity(blake2b256(b"bench/trainer")), Identity(blake2b256(b"bench/verifier"))


def timed(fn, clock=time.perf_counter) -> tuple[float, object]:
    start = clock()
    out = fn()
    return clock() - start, out


def measure(preset: str, steps: int, rounds: int, root: Path) -> dict:
    publish_run(root / "warm", TRAINER, steps=1, preset=preset)  # compile and load kernels once
    train = {True: [], False: []}
    check, answer = [], []
    for r in range(rounds):
        for fingerprints in ((True, False) if r % 2 == 0 else (False, True)):  # interleaved: drift cancels
            seconds, _ = timed(lambda: publish_run(root / f"{r}-{fingerprints}", TRAINER, steps=steps,
                                                   preset=preset, fingerprints=fingerprints), time.process_time)
            train[fingerprints].append(seconds)
        run_dir, k = root / f"{r}-True", steps - 1
        run_id = read_manifest(run_dir).run_id
        challenge, slot_challenge = challenge_signature(VERIFIER, run_id, k), slot_signature(VERIFIER, run_id, k)
        replay_s, _ = timed(lambda: replay(run_dir, k))
        answer_s, reply = timed(lambda: answer_from_run(run_dir, k, challenge))
        check_s, result = timed(lambda: check_spot(run_dir, k, challenge, slot_challenge, reply))
        assert result.passed
        check.append(check_s / replay_s)
        answer.append(answer_s / replay_s)
    with_fp, without = statistics.median(train[True]), statistics.median(train[False])
    return {"preset": preset, "steps": steps, "rounds": rounds, "train_with_cpu_s": round(with_fp, 3),
            "train_without_cpu_s": round(without, 3), "train_overhead": round(with_fp / without - 1, 4),
            "check_over_replay": round(statistics.median(check), 3),
            "answer_over_replay": round(statistics.median(answer), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--presets", nargs="*", default=["tiny", "small"])
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets:
            results.append(measure(preset, args.steps, args.rounds, Path(tmp) / preset))
            print(json.dumps(results[-1]), flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "trainer_fingerprints.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
