"""The trainer: trains a run with :func:`train_step` and publishes it as a run directory.

It hashes every state as it goes (h_0 … h_S), saves every state as a checkpoint, and signs the
manifest last, once the whole hash chain is known. The manifest's ``model`` map carries the
preset name, the full :class:`.config.GPTConfig` and the :class:`.config.Topology`.
``tamper_step`` exists for tests and the devnet: it forges the state after that step (one
flipped bit in a weight) and then carries on honestly from the forged state, as a dishonest
trainer would — so replaying that one step, and no other, disagrees with the published chain.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

import numpy as np

from open1b.protocol import Identity, RunManifest

from .config import PRESETS, GPTConfig, Topology, from_manifest_model, to_manifest_model
from .data import batch_for_step, corpus_digest, corpus_tokens
from .runfile import (
    CORPUS_NAME, DATA_ORDER, ENGINE, ENGINE_VERSION, MANIFEST_FILE, genesis_hash, next_state_hash, save_checkpoint,
    write_atomic,
)
from .state import TrainState, init_state
from .step import train_step

Progress = Callable[[int, int], None]

DEFAULT_PRESET = "tiny"


def flip_weight_bit(state: TrainState) -> TrainState:
    """The same state with the lowest mantissa bit of ``wte[0, 0]`` flipped."""
    wte = np.array(state.params["wte"], copy=True)
    wte.view(np.uint32)[0, 0] ^= np.uint32(1)
    wte.flags.writeable = False
    return replace(state, params={**state.params, "wte": wte})


def publish_run(
    out_dir: Path,
    identity: Identity,
    *,
    steps: int,
    seed: int = 0,
    preset: str = DEFAULT_PRESET,
    tamper_step: int | None = None,
    progress: Progress | None = None,
) -> RunManifest:
    """Train ``steps`` steps of ``preset`` (its model and topology) and write the run directory
    ``out_dir``; returns the signed manifest."""
    if steps < 1:
        raise ValueError("a run needs at least one step")
    if tamper_step is not None and not 0 <= tamper_step < steps:
        raise ValueError(f"tamper_step must be in [0, {steps})")
    config, topology = PRESETS[preset].config, PRESETS[preset].topology
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fields = {
        "engine": ENGINE,
        "engine_version": ENGINE_VERSION,
        "model": to_manifest_model(preset, config, topology),
        "data": {"corpus": CORPUS_NAME, "corpus_digest": corpus_digest().hex(), "order": DATA_ORDER},
        "seed": seed,
    }
    tokens = corpus_tokens()
    state = init_state(config, seed)
    hashes = [next_state_hash(genesis_hash(fields), state, None)]
    save_checkpoint(out_dir, state)
    for k in range(steps):
        batch = batch_for_step(tokens, seed, k, config, topology)
        state, _ = train_step(state, batch, topology)
        if k == tamper_step:
            state = flip_weight_bit(state)
        hashes.append(next_state_hash(hashes[-1], state, batch))
        save_checkpoint(out_dir, state)
        if progress:
            progress(k + 1, steps)
    manifest = RunManifest.create(
        identity, **fields, steps=steps, state_hashes=hashes, created_at=int(time.time()),
    )
    write_atomic(out_dir / MANIFEST_FILE, manifest.encoded)
    return manifest


def config_of(manifest: RunManifest) -> tuple[GPTConfig, Topology]:
    """The model and topology a manifest's ``model`` map names (:class:`.errors.ConfigError` if malformed)."""
    _, config, topology = from_manifest_model(dict(manifest.model))
    return config, topology
