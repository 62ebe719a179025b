"""The trainer: trains a run with :func:`train_step` and publishes it as a run directory.

It hashes every state as it goes (h_0 … h_S), saves every state as a checkpoint, and signs the
manifest last, once the whole hash chain is known. The manifest's ``model`` map carries the
preset name, the full :class:`.config.GPTConfig` and the :class:`.config.Topology`.
``tamper_step`` exists for tests and the devnet: it forges the state after that step (one
flipped bit in a weight) and then carries on honestly from the forged state, as a dishonest
trainer would — so replaying that one step, and no other, disagrees with the published chain.
"""

from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

import numpy as np

from open1b.protocol import Identity, RunManifest
from open1b.protocol.witness import WITNESS_KEY, WITNESS_TREE

from .config import PRESETS, GPTConfig, Topology, from_manifest_model, to_manifest_model
from .data import (
    BUILTIN_CORPUS, DATA_ORDER, TOKENIZER, batch_for_step, builtin_dataset, builtin_eval_dataset, builtin_split,
)
from .documents import KEY_EVAL_DOCUMENTS, Documents
from .device import DeviceChoice
from .distributed import run_steps
from .fingerprint import StepFingerprint
from .evaluation import eval_fields, eval_loss, eval_schedule, loss_bits
from .provenance import write_run_samples
from .runfile import ENGINE, ENGINE_VERSION, SCHEDULE, RunWriter
from .state import TrainState, init_state

Progress = Callable[[int, int], None]

DEFAULT_PRESET = "tiny"


def flip_weight_bit(state: TrainState) -> TrainState:
    """The same state with the lowest mantissa bit of ``wte[0, 0]`` flipped."""
    wte = np.array(state.params["wte"], copy=True)
    wte.view(np.uint32)[0, 0] ^= np.uint32(1)
    wte.flags.writeable = False
    return replace(state, params={**state.params, "wte": wte})


def run_fields(preset: str, seed: int, samples: dict, topology: Topology | None = None, *,
               evaluation: dict | None = None) -> dict:
    """The manifest's run parameters for ``preset`` trained from ``seed`` on the built-in corpus;
    ``samples`` are the fields committing to the run's samples file (:func:`.provenance.write_run_samples`).
    ``topology`` (default: the preset's) is the one the run trains with; ``evaluation`` the keys
    of its evaluation set and schedule (:func:`.evaluation.eval_fields`), whose held-out documents
    are then left out of the training documents."""
    config, topology = PRESETS[preset].config, topology or PRESETS[preset].topology
    held_out = (evaluation or {}).get(KEY_EVAL_DOCUMENTS, 0)
    return {
        "engine": ENGINE,
        "engine_version": ENGINE_VERSION,
        "model": to_manifest_model(preset, config, topology),
        "data": {"corpus": BUILTIN_CORPUS, "tokenizer": TOKENIZER, "order": DATA_ORDER, "schedule": SCHEDULE,
                 WITNESS_KEY: WITNESS_TREE,
                 **Documents.of(builtin_split(held_out).train).data_fields(), **(evaluation or {})},
        "seed": seed,
        **samples,
    }


def publish_run(
    out_dir: Path,
    identity: Identity,
    *,
    steps: int,
    seed: int = 0,
    preset: str = DEFAULT_PRESET,
    tamper_step: int | None = None,
    progress: Progress | None = None,
    ranks: int | None = None,
    device: DeviceChoice | None = None,
    eval_documents: int = 0,
    eval_every: int = 0,
    fingerprints: bool = True,
) -> RunManifest:
    """Train ``steps`` steps of ``preset`` (its model and topology) and write the run directory
    ``out_dir``; returns the signed manifest.

    ``ranks`` W replaces the preset topology's ``ranks`` and trains with W processes
    (:func:`.distributed.distributed_steps`; W = 1: this process alone). Without it, this
    process computes every rank of the preset's topology. Either way the run's bits are those of
    one-process :func:`train_step` calls on its topology. ``device`` (:func:`.device.select_device`;
    default: the CPU) is where this process computes, with ``ranks`` unset or 1 only.

    ``eval_documents`` H ≥ 1 holds out the corpus's last H documents as the evaluation set and
    evaluates every ``eval_every``-th state on it (docs/run-format.md §9); the losses go to
    ``RUN/evaluations.cbor`` for the publisher to sign.

    ``fingerprints`` records every step's fingerprint (docs/run-format.md §10.1) into
    ``RUN/fingerprints.cbor`` and commits to it in the manifest's ``data``; the states are the
    same bits either way."""
    if steps < 1:
        raise ValueError("a run needs at least one step")
    if tamper_step is not None and not 0 <= tamper_step < steps:
        raise ValueError(f"tamper_step must be in [0, {steps})")
    config, topology = PRESETS[preset].config, PRESETS[preset].topology
    if ranks is not None:
        topology = replace(topology, ranks=ranks)
    dataset = builtin_dataset(config, eval_documents)
    evaluation, schedule, eval_set = None, [], None
    if eval_documents:
        eval_set = builtin_eval_dataset(config, eval_documents)
        evaluation, schedule = eval_fields(eval_set, eval_documents, eval_every), eval_schedule(steps, eval_every)
        if not schedule:
            raise ValueError(f"eval_every {eval_every} schedules no state of a {steps}-step run")
    writer = RunWriter(Path(out_dir), run_fields(preset, seed, write_run_samples(Path(out_dir), dataset), topology,
                                                 evaluation=evaluation))
    state = init_state(config, seed)
    writer.start(state)
    # Picklable (module-level functions and partials): with W > 1 they run in every rank's process.
    batch_fn = functools.partial(batch_for_step, dataset, seed, config=config, topology=topology)
    forge = functools.partial(_forge_after, tamper_step) if tamper_step is not None else None
    backend = device.backend_for(config) if device is not None else None
    recorded: list[StepFingerprint] = []
    trained = run_steps(state, batch_fn, topology, steps, world=ranks or 1, after_step=forge, backend=backend,
                        on_fingerprint=recorded.append if fingerprints else None)
    with contextlib.closing(trained):  # a failure below ends the worker processes at once
        for k, (state, batch, report) in enumerate(trained):
            writer.record(state, batch, report.witness, recorded[k].value() if fingerprints else None)
            if state.step in schedule:
                writer.record_evaluation(state.step, loss_bits(eval_loss(state, eval_set)))
            if progress:
                progress(k + 1, steps)
    return writer.finish(identity, created_at=int(time.time()))


def _forge_after(tamper_step: int, state: TrainState) -> TrainState:
    """``tamper_step``'s forgery as a per-step hook: flip a bit of the state after that step."""
    return flip_weight_bit(state) if state.step == tamper_step + 1 else state


def config_of(manifest: RunManifest) -> tuple[GPTConfig, Topology]:
    """The model and topology a manifest's ``model`` map names (:class:`.errors.ConfigError` if malformed)."""
    _, config, topology = from_manifest_model(dict(manifest.model))
    return config, topology
