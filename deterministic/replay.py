"""Replay one step of a published run and compare with the run's state-hash chain.

The replayer trusts nothing in the run directory it has not checked: the manifest's signature
(on decode), the engine it names (it must be exactly this one), the corpus (by digest), and
the checkpoint (its bytes must have the address the manifest names, and its recomputed h_k
must equal the manifest's — so a flipped bit anywhere in the input state is caught before the
step runs, even one the step itself would round away). Only then does it run the step the
trainer ran, with the run's topology, and hash the result. The step's replay witness comes back
with the result; the caller binds it to its key.

On the CPU the state is never whole in memory (:mod:`.checkpoint_stream`): the checkpoint is
read once in pieces (its address and h_k computed on the way, the parameters kept), the step is
:func:`.step.train_step_streamed`, which reads each moment tensor back (checked against that
read) when its update runs, and the new state is hashed a tensor at a time and written only when
``out`` asks for it. The parameters and the gradient sum are never both whole either: the earlier
ranks' partial sums wait in a temporary file, and the last backward lets go of each parameter
after its last use, to be read back (and checked) for its update. A device backend runs
:func:`.step.train_step` on the same scan (its state lives on the device: each moment is read
back from the file, checked, and uploaded a tensor at a time, and the new state is downloaded and
hashed a tensor at a time: the host holds the parameters and one tensor). Both give the same bits.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from open1b.protocol import RunManifest
from open1b.protocol.witness import WITNESS_KEY, WITNESS_RULES, witness_rule

from .backend import CpuBackend, default_backend
from .checkpoint_stream import (
    CheckpointWriter, FileMoments, Scan, StateSink, add_params_and_powers, scan_checkpoint, scanned_state,
)  # fmt: skip
from .data import DATA_ORDER, TOKENIZER, batch_for_step
from .device import DeviceChoice
from .errors import CheckpointMismatchError, EngineMismatchError, RunFormatError
from .provenance import checked_run_samples
from .runfile import (
    ENGINE, REPLAYABLE_ENGINE_VERSIONS, SCHEDULE, checkpoint_path, genesis_hash, hash_of_link, link_of_root,
    read_manifest,
)  # fmt: skip
from .selfcheck import require_deterministic_machine
from .step import train_step, train_step_streamed
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
           device: DeviceChoice | None = None, out: Path | None = None, recompute: bool = True,
           spill_dir: Path | None = None) -> ReplayResult:
    """Recompute step ``step`` of the run in ``run_dir`` from checkpoint ``step`` on ``device``
    (:func:`.device.select_device`, whose self-checks it trusts; default: the CPU, checked here).
    ``out``: write the replayed state ``step + 1`` there as a checkpoint file (CPU only).
    ``recompute=False`` keeps every activation instead (:func:`.gpt.forward_backward`): more
    memory, less time, the same bits. ``spill_dir``: where the CPU step's spill file lies
    (:mod:`.spill`; default ``run_dir``, beside the checkpoint it reads)."""
    run_dir = Path(run_dir)
    manifest = manifest or read_manifest(run_dir)
    check_engine(manifest)
    if not 0 <= step < manifest.steps:
        raise RunFormatError(f"step {step} is outside the run's {manifest.steps} steps")
    rule = check_data_rules(manifest)
    config, topology = config_of(manifest)
    backend = backend_on(device, config)
    if out is not None and not isinstance(backend, CpuBackend):
        raise ValueError("replay writes the replayed state (out) on the CPU only")
    started = time.perf_counter()
    dataset = checked_run_samples(run_dir, manifest)
    prev, prev_batch = before_step(manifest, dataset, step, config, topology)
    batch = batch_for_step(dataset, manifest.seed, step, config, topology)
    scan = scan_published(run_dir, manifest, step, config, prev, prev_batch)  # h_k recomputed and checked
    if isinstance(backend, CpuBackend):
        post, report = _replay_streamed(scan, step, manifest, config, topology, backend, batch, out, recompute, rule,
                                        run_dir if spill_dir is None else Path(spill_dir))
    else:  # the device holds the whole state: uploaded and hashed a tensor at a time
        new_state, report = train_step(scanned_state(scan, config, step), batch, topology, backend=backend,
                                       recompute=recompute, witness_rule=rule)
        post = hash_of_link(manifest.state_hashes[step], link_of_root(config, step + 1, batch,
                                                                       _root_by_tensor(new_state)))
    return ReplayResult(
        run=manifest.run_id, step=step, pre_state=manifest.state_hashes[step], post_state=post,
        expected=manifest.state_hashes[step + 1], loss=report.loss, witness=report.witness, elapsed_s=time.perf_counter() - started,
    )


def _root_by_tensor(state) -> tuple[int, bytes]:
    """The state root of a device backend's new state, each tensor downloaded alone (its groups'
    ``one``, :class:`.cuda.DeviceTensors`) and hashed as it comes: the host never holds the state
    whole (:func:`.runfile.next_state_hash` would download it in one piece)."""
    sink = StateSink(state.config)
    for prefix, group in (("param", state.params), ("adam_m", state.m), ("adam_v", state.v)):
        for name in state.config.param_shapes():
            sink.add(f"{prefix}/{name}", group.one(name) if hasattr(group, "one") else group[name])
    sink.add("adam/beta1_pow", np.array([state.beta1_pow], np.float32))
    sink.add("adam/beta2_pow", np.array([state.beta2_pow], np.float32))
    return sink.root()


def before_step(manifest: RunManifest, dataset, step: int, config, topology) -> tuple[bytes, np.ndarray | None]:
    """(h_{k-1} or the genesis hash, the batch step k - 1 consumed or None): what h_k chains from."""
    if step == 0:
        return genesis_hash(manifest.body()), None
    return manifest.state_hashes[step - 1], batch_for_step(dataset, manifest.seed, step - 1, config, topology)


def scan_published(run_dir: Path, manifest: RunManifest, step: int, config, prev: bytes, prev_batch: np.ndarray | None,
                   *, keep: str | None = "param/") -> Scan:
    """Checkpoint ``step`` of the run read once in pieces (:func:`.checkpoint_stream.scan_checkpoint`:
    its address checked, the tensors named ``keep`` kept), accepted only when its recomputed h_k,
    from ``prev`` (h_{k-1} or the genesis hash) and ``prev_batch`` (the batch that step consumed;
    None at step 0), is the published one: never the file whole in memory."""
    scan = scan_checkpoint(checkpoint_path(run_dir, step), config, step, manifest.checkpoints[step], keep=keep)
    if hash_of_link(prev, link_of_root(config, step, prev_batch, scan.state_root())) != manifest.state_hashes[step]:
        raise CheckpointMismatchError(f"checkpoint {step} does not hash to the published h_{step}")
    return scan


def _replay_streamed(scan: Scan, step: int, manifest: RunManifest, config, topology, backend, batch,
                     out: Path | None, recompute: bool, rule: str, spill_dir: Path):
    """(h_{step+1} replayed, report) from checkpoint ``step``'s ``scan``, the state never whole in memory."""
    writer = CheckpointWriter(Path(out), config, step + 1) if out is not None else None
    try:
        sink = StateSink(config, writer)
        # the parameters are read back from the checkpoint for their update (each chunk checked
        # against the scan), so the step lets go of each after its last use
        reread = FileMoments(scan.path, "param", scan.slots, scan.digests, list(config.param_shapes()))
        params, report, beta1_pow, beta2_pow = train_step_streamed(scanned_state(scan, config, step), batch, topology,
                                                                   sink.add, backend=backend, recompute=recompute,
                                                                   witness_rule=rule, reread=reread,
                                                                   spill_dir=spill_dir)
        add_params_and_powers(sink, params, beta1_pow, beta2_pow)
        if writer is not None:
            writer.finish()
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    post = hash_of_link(manifest.state_hashes[step], link_of_root(config, step + 1, batch, sink.root()))
    return post, report
