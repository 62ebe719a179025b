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

from open1b.deterministic.config import PRESETS, to_manifest_model
from open1b.deterministic.data import batch_for_step, corpus_digest, corpus_tokens
from open1b.deterministic.runfile import (
    CORPUS_NAME, DATA_ORDER, ENGINE, ENGINE_VERSION, MANIFEST_FILE, genesis_hash, next_state_hash, save_checkpoint,
    write_atomic,
)
from open1b.deterministic.state import init_state
from open1b.deterministic.step import train_step
from open1b.deterministic.trainer import DEFAULT_PRESET, flip_weight_bit
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
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fields = {
        "engine": ENGINE, "engine_version": ENGINE_VERSION, "model": to_manifest_model(preset, config, topology),
        "data": {"corpus": CORPUS_NAME, "corpus_digest": corpus_digest().hex(), "order": DATA_ORDER}, "seed": seed,
    }
    tokens = corpus_tokens()
    state = init_state(config, seed)
    hashes = [next_state_hash(genesis_hash(fields), state, None)]
    save_checkpoint(out_dir, state)
    for k in range(steps):
        batch = batch_for_step(tokens, seed, k, config, topology)
        kind = forgeries.get(k)
        if kind == "skip":
            state = replace(state, step=state.step + 1)
        elif kind == "batch":
            other = batch_for_step(tokens, seed, (k + 1) % steps, config, topology)
            state, _ = train_step(state, other, topology)
        else:
            state, _ = train_step(state, batch, topology)
            if kind == "bitflip":
                state = flip_weight_bit(state)
        hashes.append(next_state_hash(hashes[-1], state, batch))  # always names the step's own batch
        save_checkpoint(out_dir, state)
    manifest = RunManifest.create(identity, **fields, steps=steps, state_hashes=hashes, created_at=int(time.time()))
    write_atomic(out_dir / MANIFEST_FILE, manifest.encoded)
    return manifest
