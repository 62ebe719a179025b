"""A dishonest trainer, for devnet scenarios and tests: publish a run whose state after chosen
steps is forged, then carry on training honestly from the forged state.

Each forgery makes exactly one step's replay disagree with the published chain: replaying step
k from checkpoint k gives another h_{k+1}, while checkpoint k+1 (the forged state) hashes to
the published h_{k+1}, so every later step replays cleanly. Every forged run records step
fingerprints (docs/run-format.md §10.1) consistent with what the forger claims, so that only a
replay or a spot check (:func:`open1b.deterministic.spot_run.check_spot`) can catch it:

* ``bitflip`` — one mantissa bit of one weight flipped after the step (honest fingerprint);
* ``batch``   — the step trained on another step's batch while its hash names its own
  (fingerprints of what it trained on);
* ``skip``    — the step never ran: the state before it is published, relabelled as after it,
  with a made-up witness (honest fingerprint of the committed batch);
* ``forged-data`` — the step trained on other text (the committed step's batch drawn with
  another seed) with fingerprints of what it trained on: spot checks catch it at ``loss``;
* ``skipped-update`` — the honest fingerprint and witness of the committed batch, but
  checkpoint k+1 is checkpoint k relabelled, not AdamW of the committed sum: caught at ``update``;
* ``forged-microbatch`` — slot :func:`forged_slot` (k) of the step has its gradient doubled, and
  every commitment follows from that (the update, the witness): caught at ``gradient``
  by a challenge whose secret slot is that one, by no other (when the forger answers with
  :func:`forged_answer`, consistent with its commitments);
* ``forged-loss`` — an honest step whose fingerprint reports another loss (one bit flipped): the
  state chain is honest, so no replay disagrees; spot checks catch it at ``loss_sum``;
* ``forged-op`` — the step computed on :class:`.forged_op.ForgingBackend` (one op's output one bit
  off, and everything after it follows): a replay disagrees, and a dispute (docs/protocol.md
  §18.5) ends in a fraud proof naming that op.

This reuses the engine's public pieces (the same ``train_step`` an honest trainer calls, and
its step pieces for the forged micro-batch); only the forged steps differ from
:func:`open1b.deterministic.trainer.publish_run`.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Mapping

import numpy as np

from open1b.deterministic.backend import default_backend
from open1b.deterministic.checkpoint_stream import scanned_state
from open1b.deterministic.config import PRESETS, Topology
from open1b.deterministic.data import batch_for_step, builtin_dataset
from open1b.deterministic.fingerprint import (
    ChunkOpening,
    StepFingerprint,
    chunk,
    chunk_count,
    f32_bits,
    fingerprinted_step,
    flat_gradient,
)
from open1b.deterministic.provenance import load_run_samples, write_run_samples
from open1b.deterministic.replay import before_step, scan_published
from open1b.deterministic.runfile import RunWriter, read_manifest
from open1b.deterministic.spot_run import answer_from_run, encode_answer
from open1b.deterministic.state import TrainState, init_state
from open1b.deterministic.step import finish_step, step_gradients
from open1b.deterministic.trainer import DEFAULT_PRESET, config_of, flip_weight_bit, run_fields
from open1b.protocol import Identity, RunManifest
from open1b.protocol.spotcheck import derive_chunks

from .forged_op import ForgingBackend

FORGERIES = ("bitflip", "batch", "skip", "forged-data", "skipped-update", "forged-microbatch", "forged-loss",
             "forged-op")
FORGERIES_FILE = "forgeries.txt"
"""The forger's own note of what it forged (``<step> <kind>`` lines): not part of the run, read by
:func:`forged_answer` so that the forger answers challenges consistently with its commitments."""


def forged_slot(step: int, slots: int) -> int:
    """The slot whose gradient ``forged-microbatch`` forges at ``step``."""
    return step % slots


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
        if kind in ("skip", "skipped-update"):  # nothing is applied: checkpoint k, relabelled k + 1
            _, report, fp = fingerprinted_step(state, batch, topology)
            witness = bytes(32) if kind == "skip" else report.witness
            state = replace(state, step=state.step + 1)
        elif kind in ("batch", "forged-data"):
            other = batch_for_step(dataset, seed, (k + 1) % steps, config, topology) if kind == "batch" else \
                batch_for_step(dataset, seed + 1, k, config, topology)
            state, report, fp = fingerprinted_step(state, other, topology)
            witness = report.witness
        elif kind == "forged-op":
            state, report, fp = fingerprinted_step(state, batch, topology, backend=ForgingBackend())
            witness = report.witness
        elif kind == "forged-microbatch":
            state, report, fp, _ = _forged_micro_step(state, batch, topology)
            witness = report.witness
        else:
            state, report, fp = fingerprinted_step(state, batch, topology)
            witness = report.witness
            if kind == "bitflip":
                state = flip_weight_bit(state)
            elif kind == "forged-loss":
                fp = replace(fp, loss=fp.loss ^ 1)
        writer.record(state, batch, witness, fp.value())  # h_{k+1} always names the step's own batch
    (Path(out_dir) / FORGERIES_FILE).write_text("".join(f"{k} {v}\n" for k, v in sorted(forgeries.items())))
    return writer.finish(identity, created_at=int(time.time()))


def _forged_micro_step(state: TrainState, batch: np.ndarray, topology: Topology):
    """Step ``state.step`` with slot :func:`forged_slot`'s gradient doubled before the sum: the new
    state, report and fingerprint that follow from it, and every slot's flat gradient and the sum
    (what the forger opens in its answers)."""
    be = default_backend(state.config)
    loss, grads, losses, (flats, summed) = _forged_micro_gradients(state, batch, topology, be)
    new_state, report = finish_step(state, loss, grads, be)
    fp = StepFingerprint(state.step, tuple(losses), f32_bits(report.loss), f32_bits(report.grad_norm),
                         f32_bits(report.clip_coef))
    return new_state, report, fp, (flats, summed)


def _forged_micro_gradients(state: TrainState, batch: np.ndarray, topology: Topology, be):
    """The gradients of :func:`_forged_micro_step`: the step's loss and summed gradients (backend
    arrays), every slot's loss bits, and every slot's flat gradient and the sum."""
    config = state.config
    slots = topology.ranks * topology.micro_batches
    target = forged_slot(state.step, slots)
    losses, flats = [0] * slots, [np.empty(0, np.float32)] * slots

    def observe(rank: int, micro: int, loss, grads: dict) -> None:  # before the micro-batch is summed
        slot = rank * topology.micro_batches + micro
        if slot == target:
            for name in config.param_shapes():
                grads[name] = be.upload(np.asarray(be.download(grads[name])) * np.float32(2))
        losses[slot], flats[slot] = f32_bits(be.download(loss)), flat_gradient(grads, config, be)

    loss, grads = step_gradients(state, batch, topology, be, observe)
    return loss, grads, losses, (flats, flat_gradient(grads, config, be))


def forgery_of(run_dir: Path, step: int) -> str | None:
    """How ``step`` of the run in ``run_dir`` was forged, from the forger's note (None: honest)."""
    note = Path(run_dir) / FORGERIES_FILE  # absent: an honest run
    forged = dict(line.split() for line in note.read_text().splitlines()) if note.is_file() else {}
    return forged.get(str(step))


def forged_answer(run_dir: Path, step: int, challenge: bytes) -> bytes:
    """The forger's answer to a challenge of ``step``: for a ``forged-microbatch`` step, the
    chunks of the gradients it committed to (so that only the forged slot's recomputation can
    catch it); for every other step, the honest answer (:func:`answer_from_run`)."""
    if forgery_of(run_dir, step) != "forged-microbatch":
        return answer_from_run(run_dir, step, challenge)
    manifest = read_manifest(Path(run_dir))
    config, topology = config_of(manifest)
    dataset = load_run_samples(Path(run_dir), manifest)
    batch = batch_for_step(dataset, manifest.seed, step, config, topology)
    # checkpoint k read in pieces, as a replay reads it: the parameters kept, the moments left in the
    # file (the answer needs the gradients only, not the update)
    scan = scan_published(Path(run_dir), manifest, step, config, *before_step(manifest, dataset, step, config, topology))
    state = scanned_state(scan, config, step)
    *_, (flats, summed) = _forged_micro_gradients(state, batch, topology, default_backend(config))
    return encode_answer(step, tuple(ChunkOpening(c, tuple(chunk(f, c) for f in flats), chunk(summed, c))
                                     for c in derive_chunks(challenge, chunk_count(config))))
