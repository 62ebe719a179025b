"""Replay one step of a published run and compare with the run's state-hash chain.

The replayer trusts nothing in the run directory it has not checked: the manifest's signature
(on decode), the engine it names (it must be exactly this one), the corpus (by digest), and
the checkpoint (its bytes must have the address the manifest names, and its recomputed h_k
must equal the manifest's — so a flipped bit anywhere in the input state is caught before the
step runs, even one the step itself would round away). Only then does it call the same
:func:`train_step` the trainer called, with the run's topology, and hash the result. The
step's replay witness comes back with the result; the caller binds it to its key.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from open1b.protocol import RunManifest
from open1b.protocol.witness import WITNESS_KEY, WITNESS_RULES, witness_rule

from .backend import default_backend
from .data import DATA_ORDER, TOKENIZER, batch_for_step
from .device import DeviceChoice
from .errors import CheckpointMismatchError, EngineMismatchError, RunFormatError
from .provenance import checked_run_samples
from .runfile import (
    ENGINE, REPLAYABLE_ENGINE_VERSIONS, SCHEDULE, genesis_hash, load_checkpoint, next_state_hash, read_manifest,
)  # fmt: skip
from .selfcheck import require_deterministic_machine
from .step import train_step
from .trainer import config_of


@dataclass(frozen=True)
class ReplayResult:
    run: bytes
    step: int
    pre_state: bytes  # h_step, recomputed from the checkpoint and equal to the published one
    post_state: bytes  # the replayed h_{step+1}
    expected: bytes  # the published h_{step+1}
    loss: np.float32
    witness: bytes  # W_k of this replay (docs/run-format.md §5)
    elapsed_s: float

    @property
    def match(self) -> bool:
        return self.post_state == self.expected


def check_engine(manifest: RunManifest) -> None:
    if manifest.engine != ENGINE or manifest.engine_version not in REPLAYABLE_ENGINE_VERSIONS:
        raise EngineMismatchError(
            f"run needs engine {manifest.engine} {manifest.engine_version}; this node replays {ENGINE} "
            f"{', '.join(REPLAYABLE_ENGINE_VERSIONS)}")


def check_data_rules(manifest: RunManifest) -> str:
    """Refuse a run whose data order, tokenizer, schedule or witness rule is not this engine's
    own; returns the run's witness rule (docs/run-format.md §5.1)."""
    if (manifest.data.get("order"), manifest.data.get("tokenizer"), manifest.data.get("schedule")) != (
            DATA_ORDER, TOKENIZER, SCHEDULE):
        raise RunFormatError(f"run's data rules {dict(manifest.data)} are not this engine's "
                             f"({DATA_ORDER}, {TOKENIZER}, {SCHEDULE})")
    if (rule := witness_rule(manifest.data)) is None:
        raise RunFormatError(f"run's witness rule {manifest.data.get(WITNESS_KEY)!r} is not one of {WITNESS_RULES}")
    return rule


def backend_on(device: DeviceChoice | None, config):
    """The backend that recomputes a run's step on ``device`` (:func:`.device.select_device`, whose
    self-checks it trusts); ``None``: the CPU, self-checked here."""
    if device is None:
        backend = default_backend(config)
        require_deterministic_machine(backend)
        return backend
    return device.backend_for(config)


def replay(run_dir: Path, step: int, manifest: RunManifest | None = None, *,
           device: DeviceChoice | None = None) -> ReplayResult:
    """Recompute step ``step`` of the run in ``run_dir`` from checkpoint ``step`` on ``device``
    (:func:`.device.select_device`, whose self-checks it trusts; default: the CPU, checked here)."""
    run_dir = Path(run_dir)
    manifest = manifest or read_manifest(run_dir)
    check_engine(manifest)
    if not 0 <= step < manifest.steps:
        raise RunFormatError(f"step {step} is outside the run's {manifest.steps} steps")
    rule = check_data_rules(manifest)
    config, topology = config_of(manifest)
    backend = backend_on(device, config)
    started = time.perf_counter()
    dataset = checked_run_samples(run_dir, manifest)
    state = load_checkpoint(run_dir, step, config, manifest.checkpoints[step])
    if step == 0:
        recomputed = next_state_hash(genesis_hash(manifest.body()), state, None)
    else:
        prev_batch = batch_for_step(dataset, manifest.seed, step - 1, config, topology)
        recomputed = next_state_hash(manifest.state_hashes[step - 1], state, prev_batch)
    if recomputed != manifest.state_hashes[step]:
        raise CheckpointMismatchError(f"checkpoint {step} does not hash to the published h_{step}")
    batch = batch_for_step(dataset, manifest.seed, step, config, topology)
    new_state, report = train_step(state, batch, topology, backend=backend, witness_rule=rule)
    post = next_state_hash(manifest.state_hashes[step], new_state, batch)
    return ReplayResult(
        run=manifest.run_id, step=step, pre_state=recomputed, post_state=post,
        expected=manifest.state_hashes[step + 1], loss=report.loss, witness=report.witness, elapsed_s=time.perf_counter() - started,
    )
