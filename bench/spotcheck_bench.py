"""Spot-check benchmark (issue 18): what fingerprints cost the trainer, what a spot check costs the
verifier and the trainer's answer, each as a ratio to a training step measured in the same run,
and each forgery's detection per challenge over seeded random challenges.

    .venv/bin/python bench/spotcheck_bench.py [--rounds 5] [--trials 400] [--presets tiny small small-32]

* ``fingerprint_overhead``: :func:`.fingerprint.fingerprinted_step` ÷ :func:`.step.train_step` − 1
  (target ≤ 5%), wall time; ``fingerprint_cpu_overhead`` the same in the process's CPU time (what
  recording costs a machine with no idle core). Recording hashes nothing: it keeps the loss bits
  of each micro-batch, so the overhead is the observer's calls and one host read of each loss.
* ``spot_over_step``: the verifier's compute for one challenge — :func:`.fingerprint.recompute_slot`
  (one micro-batch), :func:`.fingerprint.check_loss_sum` and :func:`.fingerprint.check_chunks` —
  ÷ one replay of the step (target ≤ 5%). It cannot be below 1 / (ranks × micro_batches): the
  ``small`` preset has one micro-batch per step, so ``small-32`` is ``small``'s model with 32
  one-sequence micro-batches (8 ranks × 4), the shape of a real run's step.
* ``answer_over_step``: :func:`.fingerprint.answer_challenge` ÷ one step (target ≤ 1);
  ``answer_over_recorded_step`` ÷ the fingerprinted step an auditable run's trainer takes.
* ``detection``: over ``--trials`` challenges by keys derived from ``--seed`` (``tiny``; the same
  seed gives the same challenges and counts), the challenges of a forged step that catch it,
  beside docs/run-format.md §10.3's stated value, with a 95% Wilson interval and the two-sided
  binomial p-value of the count under the stated probability.

The machine is shared: every ratio is of minima over ``--rounds`` interleaved repetitions (the
least-disturbed run of each), medians are kept beside them, and the 1-minute load average is
recorded before and after. Checkpoint I/O is excluded on both sides (a replay loads checkpoints
too). Writes bench/results/spotcheck.json (costs; a preset's row replaces its earlier one, so
presets may run separately with their own ``--rounds``) and bench/results/spotcheck_detection.json.
"""

from __future__ import annotations

import argparse
import json
import math
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
    chunk_count,
    fingerprinted_step,
    recompute_slot,
)  # fmt: skip
from open1b.protocol import Identity, challenge_signature, derive_chunks, derive_slot, slot_signature
from open1b.protocol.hashing import blake2b256

RESULTS = Path(__file__).parent / "results"
SEED = 3


def shapes(name: str):
    if name == "small-32":
        return PRESETS["small"].config, Topology(ranks=8, micro_batches=4, micro_batch_size=1)
    return PRESETS[name].config, PRESETS[name].topology


def timed(fn) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of ``fn()``."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def challenge(key: bytes, slots: int, chunks_total: int) -> tuple[int, tuple[int, ...]]:
    """The (slot, chunks) that the verifier with Ed25519 seed ``key`` challenges in step 1."""
    identity = Identity(key)
    return (derive_slot(slot_signature(identity, b"\0" * 32, 1), slots),
            derive_chunks(challenge_signature(identity, b"\0" * 32, 1), chunks_total))


def keys(seed: int, label: str, count: int) -> list[bytes]:
    return [blake2b256(f"spotcheck-bench/{seed}/{label}/{i}".encode()) for i in range(count)]


def costs(name: str, rounds: int, seed: int) -> dict:
    config, topology = shapes(name)
    data = builtin_dataset(config)
    load_before = os.getloadavg()[0]
    s0 = init_state(config, SEED)
    s1, _ = train_step(s0, batch_for_step(data, SEED, 0, config, topology), topology)  # warm, and moments ≠ 0
    batch = batch_for_step(data, SEED, 1, config, topology)
    s2, _, fp = fingerprinted_step(s1, batch, topology)
    slot, chunks = challenge(keys(seed, name, 1)[0], topology.ranks * topology.micro_batches, chunk_count(config))
    answer = answer_challenge(s1, batch, topology, chunks)
    _, mine = recompute_slot(fp, s1, batch, topology, slot, chunks)
    runs = {
        "step": lambda: train_step(s1, batch, topology),
        "fingerprinted": lambda: fingerprinted_step(s1, batch, topology),
        "spot": lambda: (recompute_slot(fp, s1, batch, topology, slot, chunks), check_loss_sum(fp, config, topology)),
        "chunks": lambda: check_chunks(fp, answer, slot, mine, s1, s2, topology),
        "answer": lambda: answer_challenge(s1, batch, topology, chunks),
    }
    wall: dict[str, list[float]] = {k: [] for k in runs}
    cpu: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(rounds):
        for k, fn in runs.items():
            w, c = timed(fn)
            wall[k].append(w)
            cpu[k].append(c)
    low = {k: min(v) for k, v in wall.items()}
    low_cpu = {k: min(v) for k, v in cpu.items()}
    med = {k: statistics.median(v) for k, v in wall.items()}
    return {
        "preset": name, "topology": [topology.ranks, topology.micro_batches, topology.micro_batch_size],
        "params": config.n_params(), "chunks": chunk_count(config), "rounds": rounds,
        "seconds_min": low, "seconds_median": med, "cpu_seconds_min": low_cpu, "seconds_all": wall,
        "fingerprint_overhead": low["fingerprinted"] / low["step"] - 1,
        "fingerprint_overhead_median": med["fingerprinted"] / med["step"] - 1,
        "fingerprint_cpu_overhead": low_cpu["fingerprinted"] / low_cpu["step"] - 1,
        "spot_over_step": (low["spot"] + low["chunks"]) / low["step"],
        "spot_floor": 1 / (topology.ranks * topology.micro_batches),
        "answer_over_step": low["answer"] / low["step"],
        # ÷ the step the trainer of an auditable run takes, which records the fingerprints
        "answer_over_recorded_step": low["answer"] / low["fingerprinted"],
        "load_before": load_before, "load_after": os.getloadavg()[0],
    }


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    p, d = k / n, 1 + z * z / n
    mid, half = (p + z * z / (2 * n)) / d, z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, mid - half), min(1.0, mid + half)


def binomial_p(k: int, n: int, p: float) -> float:
    """Two-sided exact binomial test: P(a count at most as likely as ``k`` | n, p)."""
    pmf = [math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(n + 1)]
    return min(1.0, sum(q for q in pmf if q <= pmf[k] * (1 + 1e-9)))


def detection(trials: int, seed: int) -> dict:
    """Each scenario's forgery of step 1 of ``tiny``, challenged by ``trials`` seeded keys."""

    config, topology = PRESETS["tiny"].config, PRESETS["tiny"].topology
    data = builtin_dataset(config)
    s1, _ = train_step(init_state(config, SEED), batch_for_step(data, SEED, 0, config, topology), topology)
    batch = batch_for_step(data, SEED, 1, config, topology)
    s2, _, honest = fingerprinted_step(s1, batch, topology)
    other = batch_for_step(data, SEED + 1, 1, config, topology)
    substituted = fingerprinted_step(s1, other, topology)[2]
    # the worst case of a forged micro-batch: slot 2's gradient comes from other text, everything
    # the trainer commits and answers (the sum, checkpoint k+1) is consistent with it, and it
    # commits the honest losses, so only the secret slot's gradient can tell
    one_forged = batch.copy()
    one_forged[1, 0] = other[1, 0]
    s2_forged, _, forged_micro = fingerprinted_step(s1, one_forged, topology)
    forged_micro = replace(forged_micro, losses=honest.losses, loss=honest.loss)
    skipped = replace(s1, step=2)  # the update skipped: checkpoint k+1 holds state k
    slots, total = topology.ranks * topology.micro_batches, chunk_count(config)

    def spot(key: bytes, fp, after, trained) -> Caught:
        """One challenge; ``trained``: the batch the trainer answers from (None: it does not answer)."""
        slot, chunks = challenge(key, slots, total)
        caught, mine = recompute_slot(fp, s1, batch, topology, slot, chunks)
        if caught is Caught.NONE:
            caught = check_loss_sum(fp, config, topology)
        if caught is not Caught.NONE:
            return caught
        if trained is None:
            return Caught.NO_ANSWER
        return check_chunks(fp, answer_challenge(s1, trained, topology, chunks), slot, mine, s1, after, topology)

    scenarios = {  # name: (fingerprint, checkpoint k+1, batch answered from, stated detection per challenge)
        "honest": (honest, s2, batch, 0.0),
        "forged-data": (substituted, s2, other, 1.0),
        "forged-micro-batch": (forged_micro, s2_forged, one_forged, 1 / slots),
        "skipped-update": (honest, skipped, batch, 1.0),
        "refuses-to-answer": (honest, s2, None, 1.0),
    }
    out = {}
    for name, (fp, after, trained, stated) in scenarios.items():
        results = [spot(key, fp, after, trained) for key in keys(seed, name, trials)]
        caught = sum(r is not Caught.NONE for r in results)
        out[name] = {"trials": trials, "seed": seed, "caught": caught, "rate": caught / trials, "stated": stated,
                     "wilson95": wilson(caught, trials), "p_value": binomial_p(caught, trials, stated),
                     "links": sorted({r.value for r in results if r is not Caught.NONE})}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--trials", type=int, default=400)
    ap.add_argument("--seed", type=int, default=1, help="derives every challenge key")
    ap.add_argument("--presets", nargs="*", default=["tiny", "small", "small-32"])
    args = ap.parse_args()
    RESULTS.mkdir(exist_ok=True)
    if args.trials:
        found = detection(args.trials, args.seed)
        (RESULTS / "spotcheck_detection.json").write_text(json.dumps(found, indent=1) + "\n")
        for name, d in found.items():
            print(f"{name:20} caught {d['caught']}/{d['trials']} (stated {d['stated']:.2f}, p {d['p_value']:.2f})"
                  f" by {d['links']}", flush=True)
    # a preset's row replaces its earlier one (presets may run separately, with their own --rounds),
    # written after each preset: a slow one leaves the others' rows
    path = RESULTS / "spotcheck.json"
    report = json.loads(path.read_text()) if path.exists() else {"costs": []}
    for preset in args.presets:
        row = costs(preset, args.rounds, args.seed)
        report["costs"] = [r for r in report["costs"] if r["preset"] != preset] + [row]
        path.write_text(json.dumps(report, indent=1) + "\n")
        print(f"{row['preset']:9} fingerprints +{row['fingerprint_overhead']:.1%} of a step"
              f" (CPU +{row['fingerprint_cpu_overhead']:.1%}); spot check {row['spot_over_step']:.1%} of a replay;"
              f" answer {row['answer_over_step']:.2f} steps; load {row['load_before']:.1f}→{row['load_after']:.1f}",
              flush=True)


if __name__ == "__main__":
    main()
