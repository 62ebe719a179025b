"""The memorisation signal against substituted data, early and late in training (issue 18, item 4).

    .venv/bin/python bench/memorisation_bench.py [--preset tiny] [--windows 0 300 1000] [--steps 150]

Choi, Shavit and Duvenaud (2023): a step trained on its committed batch B lowers the loss on B
more than on held-out text H. With θ_k the state before step k and θ' the state the trainer
published after it,

    signal = [L(θ_k, B) − L(θ', B)] − [L(θ_k, H) − L(θ', H)]

An honest θ' comes from training on B; a forged one from training on other text B' (the
trainer commits B but trains on B'), so its signal has no reason to be large. A verifier flags a
step whose signal is below a threshold set on honest steps for a false-positive rate (1%, 5%,
10%); ``detection`` is the share of forged steps flagged. For each window of ``--steps``
consecutive steps starting at each ``--windows`` value, along one honest run (seeded), every
step is scored honest and forged from the same θ_k. B' is another seed's batch of step k, H
eight held-out samples (the last two documents of the corpus, which the run never trains on).
The signal is never evidence (docs/run-format.md §10.5); this measures whether it is worth
using to rank which steps to challenge. Writes bench/results/memorisation.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from open1b.deterministic import PRESETS, Topology, batch_for_step, builtin_dataset, init_state, train_step
from open1b.deterministic.backend import default_backend
from open1b.deterministic.data import builtin_eval_dataset
from open1b.deterministic.step import step_gradients

RESULTS = Path(__file__).parent / "results"
SEED = 7
HELD_OUT_DOCS = 2
FPRS = (0.01, 0.05, 0.10)


def batch_loss(state, batch: np.ndarray) -> float:
    """The mean loss of every sequence of ``batch`` under ``state`` (one micro-batch each)."""
    rows = batch.reshape(-1, batch.shape[-1])
    topology = Topology(ranks=1, micro_batches=rows.shape[0], micro_batch_size=1)
    be = default_backend(state.config)
    loss, _ = step_gradients(state, rows.reshape(1, rows.shape[0], 1, -1), topology, be)
    return float(be.download(loss)[0])


def signal(after, batch: np.ndarray, held: np.ndarray, base: tuple[float, float]) -> float:
    return (base[0] - batch_loss(after, batch)) - (base[1] - batch_loss(after, held))


def curve(honest: list[float], forged: list[float]) -> dict:
    """Detection at each false-positive rate (flag: signal below the honest quantile) and the AUC."""
    h, f = np.sort(honest), np.asarray(forged)
    out = {}
    for fpr in FPRS:
        threshold = h[int(np.floor(fpr * len(h)))]  # flags fewer than fpr·n honest steps (strictly below)
        out[f"detection_at_{fpr:g}"] = float(np.mean(f < threshold))
        out[f"false_positive_at_{fpr:g}"] = float(np.mean(h < threshold))
    out["auc"] = float(np.mean([[1.0 if fs < hs else 0.5 if fs == hs else 0.0 for hs in h] for fs in f]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--windows", type=int, nargs="*", default=[0, 300, 1000])
    ap.add_argument("--steps", type=int, default=150, help="steps scored per window")
    args = ap.parse_args()
    preset = PRESETS[args.preset]
    config, topology = preset.config, preset.topology
    train = builtin_dataset(config, held_out=HELD_OUT_DOCS)
    held_samples = builtin_eval_dataset(config, HELD_OUT_DOCS).samples.astype(np.int32)
    rng = np.random.default_rng(SEED)
    started, state = time.perf_counter(), init_state(config, SEED)
    windows, k = [], 0
    for start in sorted(args.windows):
        while k < start:  # the honest run up to the window
            state, _ = train_step(state, batch_for_step(train, SEED, k, config, topology), topology)
            k += 1
        honest, forged, losses = [], [], []
        for _ in range(args.steps):
            batch = batch_for_step(train, SEED, k, config, topology)
            other = batch_for_step(train, SEED + 1, k, config, topology)
            held = held_samples[rng.integers(0, held_samples.shape[0], topology.sequences)]
            base = (batch_loss(state, batch), batch_loss(state, held))
            after, _ = train_step(state, batch, topology)
            forged_after, _ = train_step(state, other, topology)
            honest.append(signal(after, batch, held, base))
            forged.append(signal(forged_after, batch, held, base))
            losses.append(base[0])
            state, k = after, k + 1
        row = {"start": start, "steps": args.steps, "train_loss_mean": float(np.mean(losses)),
               "honest_mean": float(np.mean(honest)), "forged_mean": float(np.mean(forged)), **curve(honest, forged)}
        windows.append(row)
        print(row, flush=True)
    out = {"preset": args.preset, "seed": SEED, "topology": [topology.ranks, topology.micro_batches,
           topology.micro_batch_size], "windows": windows, "wall_s": time.perf_counter() - started,
           "load": os.getloadavg()[0]}  # fmt: skip
    (RESULTS / "memorisation.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
