"""The trainer: trains a run with :func:`train_step` and publishes it as a run directory.

It hashes every state as it goes (h_0 … h_S), saves every state as a checkpoint, and signs the
manifest last, once the whole hash chain is known. The manifest's ``model`` map carries the
preset name, the full :class:`.config.GPTConfig` and the :class:`.config.Topology`.
One process on the CPU (the default) trains with the state a tensor at a time
(:mod:`.checkpoint_stream`): the parameters in memory, the moments in the last checkpoint written,
read back for each tensor's update, the new state hashed and written tensor by tensor. The
parameters, too, are in that checkpoint (written and hashed before the step), so the step lets
go of each after its last use and reads it back, chunk-checked, for its update, and the gradient
sums wait in a spill file (:mod:`.spill`, in the run directory or ``spill_dir``): a run's memory is
its parameters or its gradients, and one micro-batch's activations, as a replay's is.
Data-parallel ranks and device backends hold whole states; all give the same bits.

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
from .backend import CpuBackend, default_backend
from .checkpoint_stream import CheckpointWriter, FileMoments, StateSink, add_params_and_powers, file_state
from .device import DeviceChoice
from .distributed import launched_rank, run_steps
from .fingerprint import StepFingerprint, fingerprinted_step_streamed
from .evaluation import eval_fields, eval_loss, eval_schedule, loss_bits
from .provenance import write_run_samples
from .runfile import ENGINE, ENGINE_VERSION, SCHEDULE, RunWriter, checkpoint_path, link_of_root
from .state import TrainState, init_param, init_state
from .step import train_step_streamed

Progress = Callable[[int, int], None]

DEFAULT_PRESET = "tiny"


def flip_weight_bit(state: TrainState) -> TrainState:
    """The same state with the lowest mantissa bit of ``wte[0, 0]`` flipped."""
    return replace(state, params={**state.params, "wte": _flipped(state.params["wte"])})


def _flipped(wte: np.ndarray) -> np.ndarray:
    wte = np.array(wte, copy=True)
    wte.view(np.uint32)[0, 0] ^= np.uint32(1)
    wte.flags.writeable = False
    return wte


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
    spill_dir: Path | None = None,
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
    same bits either way. ``spill_dir``: where the one-process CPU trainer's spill file lies
    (:mod:`.spill`; default ``out_dir``)."""
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
    backend = device.backend_for(config) if device is not None else None
    if (ranks or 1) == 1 and launched_rank() is None and isinstance(backend or default_backend(config), CpuBackend):
        trained = _streamed_steps(Path(out_dir), writer, config, seed, topology, dataset, steps, tamper_step,
                                  fingerprints, backend, Path(spill_dir or out_dir))  # fmt: skip
    else:
        trained = _whole_state_steps(writer, config, seed, topology, dataset, steps, tamper_step, fingerprints,
                                     ranks, backend)  # fmt: skip
    with contextlib.closing(trained):  # a failure below ends the worker processes at once
        for k, state in enumerate(trained):
            if state.step in schedule:
                writer.record_evaluation(state.step, loss_bits(eval_loss(state, eval_set)))
            if progress:
                progress(k + 1, steps)
    return writer.finish(identity, created_at=int(time.time()))


def _whole_state_steps(writer: RunWriter, config: GPTConfig, seed: int, topology: Topology, dataset, steps: int,
                       tamper_step: int | None, fingerprints: bool, ranks: int | None, backend):
    """The run's states, each recorded in ``writer``: :func:`.distributed.run_steps` with whole states."""
    state = init_state(config, seed)
    writer.start(state)
    # Picklable (module-level functions and partials): with W > 1 they run in every rank's process.
    batch_fn = functools.partial(batch_for_step, dataset, seed, config=config, topology=topology)
    forge = functools.partial(_forge_after, tamper_step) if tamper_step is not None else None
    recorded: list[StepFingerprint] = []
    trained = run_steps(state, batch_fn, topology, steps, world=ranks or 1, after_step=forge, backend=backend,
                        on_fingerprint=recorded.append if fingerprints else None)
    with contextlib.closing(trained):
        for k, (state, batch, report) in enumerate(trained):
            writer.record(state, batch, report.witness, recorded[k].value() if fingerprints else None)
            yield state


def _streamed_steps(run_dir: Path, writer: RunWriter, config: GPTConfig, seed: int, topology: Topology, dataset,
                    steps: int, tamper_step: int | None, fingerprints: bool, backend, spill_dir: Path):
    """The run's states, each recorded in ``writer``, with the state a tensor at a time (module
    doc): checkpoint 0 is written as it is drawn, and each step reads its moments from the last
    checkpoint and writes the next one (the forgery, if any, before its parameters are written).
    Each step reads its parameters back from the checkpoint it starts from (chunk-checked against
    the digests hashed as it was written) and spills its sums into ``spill_dir``."""
    path = checkpoint_path(run_dir, 0)
    out, params = CheckpointWriter(path, config, 0), {}
    sink = StateSink(config, out)
    for name, shape in config.param_shapes().items():
        params[name] = init_param(config, seed, name)
        zeros = np.zeros(shape, np.float32)
        sink.add(f"adam_m/{name}", zeros)
        sink.add(f"adam_v/{name}", zeros)
    add_params_and_powers(sink, params, np.float32(1.0), np.float32(1.0))
    writer.start_written(link_of_root(config, 0, None, sink.root()), out.finish())
    state, state_path = file_state(config, 0, path, out.slots, sink.digests, params), path
    for _ in range(steps):
        k = state.step
        batch = batch_for_step(dataset, seed, k, config, topology)
        path = checkpoint_path(run_dir, k + 1)
        reread = FileMoments(state_path, "param", out.slots, sink.digests, list(config.param_shapes()))
        out = CheckpointWriter(path, config, k + 1)
        sink = StateSink(config, out)
        try:
            if fingerprints:
                params, report, beta1_pow, beta2_pow, fingerprint = fingerprinted_step_streamed(
                    state, batch, topology, sink.add, backend=backend, reread=reread, spill_dir=spill_dir)
            else:
                params, report, beta1_pow, beta2_pow = train_step_streamed(state, batch, topology, sink.add,
                                                                           backend=backend, reread=reread,
                                                                           spill_dir=spill_dir)  # fmt: skip
            if k == tamper_step:
                params["wte"] = _flipped(params["wte"])
            add_params_and_powers(sink, params, beta1_pow, beta2_pow)
            address = out.finish()
        except BaseException:
            out.abort()
            raise
        writer.record_written(link_of_root(config, k + 1, batch, sink.root()), address, report.witness,
                              fingerprint.value() if fingerprints else None)
        state, state_path = file_state(config, k + 1, path, out.slots, sink.digests, params), path
        yield state


def _forge_after(tamper_step: int, state: TrainState) -> TrainState:
    """``tamper_step``'s forgery as a per-step hook: flip a bit of the state after that step."""
    return flip_weight_bit(state) if state.step == tamper_step + 1 else state


def config_of(manifest: RunManifest) -> tuple[GPTConfig, Topology]:
    """The model and topology a manifest's ``model`` map names (:class:`.errors.ConfigError` if malformed)."""
    _, config, topology = from_manifest_model(dict(manifest.model))
    return config, topology
