"""A dishonest trainer, for devnet scenarios and tests: publish a run whose state after chosen
steps is forged, then carry on training honestly from the forged state.

Each forgery makes exactly one step's replay disagree with the published chain: replaying step
k from checkpoint k gives another h_{k+1}, while checkpoint k+1 (the forged state) hashes to
the published h_{k+1}, so every later step replays cleanly. Forgeries:

* ``bitflip`` — one mantissa bit of one weight flipped after the step;
* ``batch``   — the step trained on another step's batch while its hash names its own;
* ``skip``    — the step never ran: the state before it is published, relabelled as after it.

This reuses the engine's public pieces (the same ``train_step`` an honest trainer calls); only
the forged steps differ from :func:`open1b.deterministic.trainer.publish_run`.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Mapping

from open1b.deterministic.config import PRESETS
from open1b.deterministic.data import batch_for_step, builtin_dataset
from open1b.deterministic.provenance import write_run_samples
from open1b.deterministic.runfile import RunWriter
from open1b.deterministic.state import init_state
from open1b.deterministic.step import train_step
from open1b.deterministic.trainer import DEFAULT_PRESET, flip_weight_bit, run_fields
from open1b.protocol import Identity, RunManifest

FORGERIES = ("bitflip", "batch", "skip")


def publish_forged_run(out_dir: Path, identity: Identity, *, steps: int, seed: int = 0,
                       forgeries: Mapping[int, str], preset: str = DEFAULT_PRESET) -> RunManifest:
    """Like ``publish_run``, with ``forgeries[k]`` (one of :data:`FORGERIES`) applied at step k."""
    for step, kind in forgeries.items():
        if kind not in FORGERIES or not 0 <= step < steps:
            raise ValueError(f"cannot forge {kind!r} at step {step} of {steps}")
        if kind == "batch" and steps < 2:
            raise ValueError("a swapped batch needs a run of at least 2 steps")
    config, topology = PRESETS[preset].config, PRESETS[preset].topology
    dataset = builtin_dataset(config)
    writer = RunWriter(Path(out_dir), run_fields(preset, seed, write_run_samples(Path(out_dir), dataset)))
    state = init_state(config, seed)
    writer.start(state)
    for k in range(steps):
        batch = batch_for_step(dataset, seed, k, config, topology)
        kind = forgeries.get(k)
        if kind == "skip":  # nothing ran, so there is no witness either: commit to a made-up one
            state, witness = replace(state, step=state.step + 1), bytes(32)
        elif kind == "batch":
            other = batch_for_step(dataset, seed, (k + 1) % steps, config, topology)
            state, report = train_step(state, other, topology)
            witness = report.witness
        else:
            state, report = train_step(state, batch, topology)
            witness = report.witness
            if kind == "bitflip":
                state = flip_weight_bit(state)
        writer.record(state, batch, witness)  # h_{k+1} always names the step's own batch
    return writer.finish(identity, created_at=int(time.time()))
