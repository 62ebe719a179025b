"""The run directory (run format 2, docs/run-format.md): what a trainer publishes and a replayer reads.

    RUN/manifest.cbor                      the signed RunManifest (canonical CBOR)
    RUN/checkpoints/<k:08d>.safetensors    state k (before step k), k = 0 … steps
    RUN/samples.bin                        the samples the batches are drawn from
    RUN/fingerprints.cbor                  every step's fingerprint, when the run records them (§10)

Checkpoints are safetensors files — a JSON header and raw little-endian arrays — so loading
one never executes anything (no pickle). The manifest names each file by its BLAKE2b-256 (its
blob address, so peers can serve it); a checkpoint is trusted only when its bytes have that
digest *and* the state hash recomputed from it equals the manifest's h_k (see :mod:`.replay`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from safetensors.numpy import load as load_safetensors
from safetensors.numpy import save as save_safetensors

from open1b.protocol import RUN_FORMAT, Identity, RunManifest, TensorBytes, batch_digest, encode, genesis
from open1b.protocol.commitments import state_hash_of_root, state_root
from open1b.protocol.fingerprints import FINGERPRINTS_FILE, commitment
from open1b.protocol.fingerprints import data_fields as fingerprint_fields
from open1b.protocol.hashing import blake2b256
from open1b.protocol.messages import MAX_MANIFEST_SIZE
from open1b.protocol.witness import witness_commitment

from .bounded_read import FileRefused, read_bounded
from .checkpoint_stream import HEADER_SLACK as CHECKPOINT_HEADER_SLACK  # noqa: F401 (node reads it here)
from .checkpoint_stream import METADATA_KEY as CHECKPOINT_METADATA_KEY
from .checkpoint_stream import max_checkpoint_bytes
from .config import GPTConfig
from .durable_write import write_atomic
from .errors import CheckpointMismatchError, RunFormatError
from .state import TrainState

ENGINE = "open1b-gpt"
ENGINE_VERSION = "0.5.0"  # 0.5: the replay witness is a chunk tree, named by the data key `witness` (run-format §5)
REPLAYABLE_ENGINE_VERSIONS = ("0.4.0", ENGINE_VERSION)
"""The engine versions whose runs this engine replays: 0.4.0 runs differ from 0.5.0 ones only by
their witness rule (v1, no `witness` key), which the replay reads from the run. A 0.4 engine
refuses 0.5 runs, so it never attests a step whose witness it cannot compute."""
SCHEDULE = "constant"  # the learning rate of every step is config.lr

MANIFEST_FILE = "manifest.cbor"
CHECKPOINT_DIR = "checkpoints"
SAMPLES_FILE = "samples.bin"
EVALUATIONS_FILE = "evaluations.cbor"
"""The trainer's evaluation results, a CBOR list of [state k, float32 loss bits]: not part of the manifest (the
manifest commits to the schedule and the set; results are signed as ``eval`` statements)."""


def checkpoint_path(run_dir: Path, step: int) -> Path:
    return run_dir / CHECKPOINT_DIR / f"{step:08d}.safetensors"


def as_tensor_bytes(array: np.ndarray) -> TensorBytes:
    little = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    # A byte view, not a copy: a `small` state is ~130 MB and is hashed after every step.
    return TensorBytes(str(little.dtype.name), tuple(int(d) for d in little.shape), memoryview(little.reshape(-1)).cast("B"))


def state_tensor_bytes(state: TrainState) -> dict[str, TensorBytes]:
    return {name: as_tensor_bytes(a) for name, a in state.tensors().items()}


def step_batch_digest(batch: np.ndarray) -> bytes:
    """Digest of the batch one step consumed: ``batch`` is (ranks, micro_batches, rows, T + 1)
    and each rank's share ``batch[r]`` is one entry of the protocol's per-rank list, in rank order."""
    return batch_digest([as_tensor_bytes(batch[rank]) for rank in range(batch.shape[0])])


GENESIS_KEYS = ("format", "engine", "engine_version", "model", "data", "seed", "samples_root", "samples")


def genesis_hash(manifest_fields: dict) -> bytes:
    """The ``prev`` of h_0: binds the run's format, engine, model, data rules, seed and samples."""
    return genesis({k: manifest_fields[k] for k in GENESIS_KEYS})


def lr_bits(config: GPTConfig) -> int:
    """The float32 bit pattern of the learning rate a step used (the schedule is constant)."""
    return int(config.hyper32()["lr"].view(np.uint32))


def next_state_hash(prev: bytes, state: TrainState, batch: np.ndarray | None) -> bytes:
    """h_k for ``state`` (at step k), given h_{k-1} (or the genesis hash) and the batch of step k-1;
    h_0 (``batch`` None) records no batch and a learning rate of 0."""
    return state_hash_of_root(prev, *state_link(state, batch))


def save_checkpoint(run_dir: Path, state: TrainState) -> bytes:
    """Write checkpoint ``state.step``; returns its blob address (BLAKE2b-256 of the file)."""
    # One metadata key: safetensors keeps metadata in a randomly seeded hash map, so with two keys
    # the same state would be written in two byte orders and get two blob addresses.
    data = save_safetensors(dict(state.tensors()), metadata={CHECKPOINT_METADATA_KEY: str(state.step)})
    write_atomic(checkpoint_path(run_dir, state.step), data)
    return blake2b256(data)


class RunWriter:
    """Writes a run directory as training goes and signs its manifest at the end.

    ``fields`` are the manifest's run parameters (engine … seed, samples_*); :meth:`start`
    records state 0, :meth:`record` each following state with the batch that produced it, the
    step's replay witness and, for a run with fingerprints, the step's fingerprint map. The
    trainer and the forging trainer of the devnet both use it, so the format lives in one place.

    Each state is hashed as it comes (its state root, the costly part of h_k); the chain
    h_0 … h_S is linked at :meth:`finish`, because h_0's genesis commits to the whole ``data``
    map, which then holds the fingerprints' commitments (docs/run-format.md §1, §10.1).
    """

    def __init__(self, run_dir: Path, fields: dict) -> None:
        self.run_dir, self.fields = Path(run_dir), {"format": RUN_FORMAT, **fields}
        self.links: list[tuple[int, int, bytes, int, bytes]] = []  # h_k's preimage without prev
        self.checkpoints: list[bytes] = []
        self.witnesses: list[bytes] = []
        self.fingerprints: list[dict] = []
        self.evaluations: dict[int, int] = {}

    def start(self, state: TrainState) -> None:
        self.start_written(state_link(state, None), save_checkpoint(self.run_dir, state))

    def start_written(self, link: tuple, address: bytes) -> None:
        """:meth:`start` for a checkpoint 0 already written (its :func:`state_link` and blob address)."""
        self.links.append(link)
        self.checkpoints.append(address)

    def record(self, state: TrainState, batch: np.ndarray, witness: bytes, fingerprint: dict | None = None) -> None:
        """State ``k + 1``, the batch of step k (named in h_{k+1}), W_k, step k's witness, and
        F_k's map (:meth:`.fingerprint.StepFingerprint.value`) when the run records fingerprints."""
        self.record_written(state_link(state, batch), save_checkpoint(self.run_dir, state), witness, fingerprint)

    def record_written(self, link: tuple, address: bytes, witness: bytes, fingerprint: dict | None = None) -> None:
        """:meth:`record` for a checkpoint already written (its :func:`state_link` and blob address)."""
        self.links.append(link)
        self.checkpoints.append(address)
        self.witnesses.append(witness_commitment(witness))
        if fingerprint is not None:
            self.fingerprints.append(fingerprint)

    def record_evaluation(self, k: int, loss_bits: int) -> None:
        """The evaluation loss (float32 bits) of state ``k``, an entry of the run's schedule."""
        self.evaluations[k] = loss_bits

    def finish(self, identity: Identity, created_at: int) -> RunManifest:
        fields = dict(self.fields)
        if self.fingerprints:
            if len(self.fingerprints) != len(self.witnesses):
                raise ValueError("a run records the fingerprint of every step or of none")
            data = encode(self.fingerprints)
            write_atomic(self.run_dir / FINGERPRINTS_FILE, data)
            fields["data"] = {**fields["data"], **fingerprint_fields(data, [commitment(f) for f in self.fingerprints])}
        hashes, prev = [], genesis_hash(fields)
        for link in self.links:
            prev = state_hash_of_root(prev, *link)
            hashes.append(prev)
        manifest = RunManifest.create(
            identity, **fields, steps=len(self.witnesses), state_hashes=hashes,
            checkpoints=self.checkpoints, witnesses=self.witnesses, created_at=created_at,
        )
        if self.evaluations:
            write_atomic(self.run_dir / EVALUATIONS_FILE, encode(sorted(self.evaluations.items())))
        write_atomic(self.run_dir / MANIFEST_FILE, manifest.encoded)
        return manifest


def state_link(state: TrainState, batch: np.ndarray | None) -> tuple[int, int, bytes, int, bytes]:
    """h_k's preimage but ``prev`` (as :func:`next_state_hash` fills it): step, lr bits, batch digest, count, root."""
    return link_of_root(state.config, state.step, batch, state_root(state_tensor_bytes(state)))


def link_of_root(config: GPTConfig, step: int, batch: np.ndarray | None, counted_root: tuple[int, bytes]) -> tuple:
    """:func:`state_link` of state ``step`` from its (tensor count, state root), hashed elsewhere
    (:mod:`.checkpoint_stream`)."""
    consumed = step_batch_digest(batch) if batch is not None else bytes(32)
    return (step, lr_bits(config) if batch is not None else 0, consumed, *counted_root)


def hash_of_link(prev: bytes, link: tuple) -> bytes:
    """h_k from h_{k-1} (or the genesis hash) and state k's :func:`state_link`."""
    return state_hash_of_root(prev, *link)


def load_checkpoint(run_dir: Path, step: int, config: GPTConfig, address: bytes | None = None) -> TrainState:
    """State ``step`` of the run; refused before parsing when the file is larger than its config
    allows, or when ``address`` is given and the file's BLAKE2b-256 is not it."""
    path = checkpoint_path(run_dir, step)
    try:
        data = read_bounded(path, max_checkpoint_bytes(config))
    except FileRefused as exc:
        raise RunFormatError(f"checkpoint {step}: {exc}") from None
    try:
        if address is not None and blake2b256(data) != address:
            raise CheckpointMismatchError(f"checkpoint {step}: the file is not the one the manifest names")
        tensors = load_safetensors(data)
    except RunFormatError:
        raise
    except Exception as exc:
        raise RunFormatError(f"cannot read checkpoint {path}: {exc}") from exc
    try:
        return TrainState.from_tensors(tensors, step, config)
    except ValueError as exc:
        raise RunFormatError(f"{path}: {exc}") from exc


def read_manifest(run_dir: Path) -> RunManifest:
    try:
        data = read_bounded(Path(run_dir) / MANIFEST_FILE, MAX_MANIFEST_SIZE)
    except FileRefused as exc:
        raise RunFormatError(f"no run at {run_dir}: {exc}") from None
    return RunManifest.decode(data)
