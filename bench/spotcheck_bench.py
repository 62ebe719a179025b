"""Spot-check benchmark (issue 18): what fingerprints cost the trainer, what a spot check costs the
verifier and the trainer's answer, each as a ratio to a training step measured in the same run,
and each forgery's detection per challenge over random challenges.

    .venv/bin/python bench/spotcheck_bench.py [--rounds 3] [--trials 200] [--presets tiny small small-32]

* ``fingerprint_overhead``: :func:`.fingerprint.fingerprinted_step` ÷ :func:`.step.train_step` − 1
  (target ≤ 5%).
* ``spot_over_step``: the verifier's compute for one challenge — :func:`.fingerprint.check_micro`
  (one micro-batch), :func:`.fingerprint.check_loss_sum` and :func:`.fingerprint.check_chunks` —
  ÷ one replay of the step (target ≤ 5%). It cannot be below 1 / (ranks × micro_batches): the
  ``small`` preset has one micro-batch per step, so ``small-32`` is ``small``'s model with 32
  one-sequence micro-batches (8 ranks × 4), the shape of a real run's step.
* ``answer_over_step``: :func:`.fingerprint.answer_challenge` ÷ one step (target ≤ 1).
* ``detection``: over ``--trials`` challenges with fresh random keys (``tiny``), the fraction of
  challenges of a forged step that catch it, beside docs/run-format.md §10.3's stated value.

Times are medians over ``--rounds`` interleaved repetitions on a shared machine; checkpoint I/O
is excluded on both sides (a replay loads checkpoints too). Writes bench/results/spotcheck.json
(costs) and bench/results/spotcheck_detection.json (``--trials 0``: no detection run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import replace
from pathlib import Path

from open1b.deterministic import PRESETS, Topology, batch_for_step, builtin_dataset, init_state, train_step
from open1b.deterministic.fingerprint import (
    Caught,
    answer_challenge,
    check_chunks,
    check_loss_sum,
    check_micro,
    chunk_count,
    fingerprinted_step,
)  # fmt: skip
from open1b.protocol import Identity, challenge_signature, derive_challenge

RESULTS = Path(__file__).parent / "results"
SEED = 3


def shapes(name: str):
    if name == "small-32":
        return PRESETS["small"].config, Topology(ranks=8, micro_batches=4, micro_batch_size=1)
    return PRESETS[name].config, PRESETS[name].topology


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def costs(name: str, rounds: int) -> dict:
    config, topology = shapes(name)
    data = builtin_dataset(config)
    s0 = init_state(config, SEED)
    s1, _ = train_step(s0, batch_for_step(data, SEED, 0, config, topology), topology)  # warm, and moments ≠ 0
    batch = batch_for_step(data, SEED, 1, config, topology)
    s2, _, fp = fingerprinted_step(s1, batch, topology)
    slots = topology.ranks * topology.micro_batches
    slot, chunks = derive_challenge(challenge_signature(Identity(os.urandom(32)), b"\0" * 32, 1), slots,
                                    chunk_count(config))  # fmt: skip
    rank, micro = divmod(slot, topology.micro_batches)
    answer = answer_challenge(s1, batch, topology, chunks)
    rows: dict[str, list[float]] = {k: [] for k in ("step", "fingerprinted", "spot", "chunks", "answer")}
    for _ in range(rounds):
        rows["step"].append(timed(lambda: train_step(s1, batch, topology)))
        rows["fingerprinted"].append(timed(lambda: fingerprinted_step(s1, batch, topology)))
        rows["spot"].append(timed(lambda: (check_micro(fp, s1, batch, topology, rank, micro),
                                           check_loss_sum(fp, config, topology))))
        rows["chunks"].append(timed(lambda: check_chunks(fp, answer, s1, s2, topology)))
        rows["answer"].append(timed(lambda: answer_challenge(s1, batch, topology, chunks)))
    med = {k: statistics.median(v) for k, v in rows.items()}
    return {
        "preset": name, "topology": [topology.ranks, topology.micro_batches, topology.micro_batch_size],
        "params": config.n_params(), "chunks": chunk_count(config), "rounds": rounds,
        "seconds": med,
        "fingerprint_overhead": med["fingerprinted"] / med["step"] - 1,
        "spot_over_step": (med["spot"] + med["chunks"]) / med["step"],
        "answer_over_step": med["answer"] / med["step"],
        "load": os.getloadavg()[0],
    }


def detection(trials: int) -> dict:
    """Each scenario's forgery of step 1 of ``tiny``, challenged by ``trials`` fresh random keys."""

    config, topology = PRESETS["tiny"].config, PRESETS["tiny"].topology
    data = builtin_dataset(config)
    s1, _ = train_step(init_state(config, SEED), batch_for_step(data, SEED, 0, config, topology), topology)
    batch = batch_for_step(data, SEED, 1, config, topology)
    s2, _, honest = fingerprinted_step(s1, batch, topology)
    other = batch_for_step(data, SEED + 1, 1, config, topology)
    substituted = fingerprinted_step(s1, other, topology)[2]
    # the worst case of a forged micro-batch: slot 2's gradient comes from other text, and everything
    # the trainer commits and answers (its root, the sum, checkpoint k+1) is consistent with it
    one_forged = batch.copy()
    one_forged[1, 0] = other[1, 0]
    s2_forged, _, forged_micro = fingerprinted_step(s1, one_forged, topology)
    skipped = replace(s1, step=2)  # the update skipped: checkpoint k+1 holds state k
    slots, total = topology.ranks * topology.micro_batches, chunk_count(config)

    def spot(fp, after, trained) -> Caught:
        """One challenge; ``trained``: the batch the trainer answers from (None: it does not answer)."""
        slot, chunks = derive_challenge(challenge_signature(Identity(os.urandom(32)), b"\0" * 32, 1), slots, total)
        for caught in (check_micro(fp, s1, batch, topology, *divmod(slot, topology.micro_batches)),
                       check_loss_sum(fp, config, topology)):
            if caught is not Caught.NONE:
                return caught
        if trained is None:
            return Caught.NO_ANSWER
        return check_chunks(fp, answer_challenge(s1, trained, topology, chunks), s1, after, topology)

    scenarios = {  # name: (fingerprint, checkpoint k+1, batch answered from, stated detection per challenge)
        "honest": (honest, s2, batch, 0.0),
        "forged-data": (substituted, s2, other, 1.0),
        "forged-micro-batch": (forged_micro, s2_forged, one_forged, 1 / slots),
        "skipped-update": (honest, skipped, batch, 1.0),
        "refuses-to-answer": (honest, s2, None, 1.0),
    }
    out = {}
    for name, (fp, after, trained, stated) in scenarios.items():
        results = [spot(fp, after, trained) for _ in range(trials)]
        caught = sum(r is not Caught.NONE for r in results)
        out[name] = {"trials": trials, "caught": caught, "rate": caught / trials, "stated": stated,
                     "links": sorted({r.value for r in results if r is not Caught.NONE})}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--presets", nargs="*", default=["tiny", "small", "small-32"])
    args = ap.parse_args()
    RESULTS.mkdir(exist_ok=True)
    if args.trials:
        found = detection(args.trials)
        (RESULTS / "spotcheck_detection.json").write_text(json.dumps(found, indent=1) + "\n")
        for name, d in found.items():
            print(f"{name:20} caught {d['caught']}/{d['trials']} (stated {d['stated']:.2f}) by {d['links']}", flush=True)
    report: dict = {"costs": []}
    for preset in args.presets:  # written after each preset: a slow one leaves the others' rows
        row = costs(preset, args.rounds)
        report["costs"].append(row)
        (RESULTS / "spotcheck.json").write_text(json.dumps(report, indent=1) + "\n")
        print(f"{row['preset']:9} fingerprints +{row['fingerprint_overhead']:.1%} of a step;"
              f" spot check {row['spot_over_step']:.1%} of a replay; answer {row['answer_over_step']:.2f} steps",
              flush=True)


if __name__ == "__main__":
    main()
