"""The run directory: what a trainer publishes and a replayer reads.

    RUN/manifest.cbor                      the signed RunManifest (canonical CBOR)
    RUN/checkpoints/<k:08d>.safetensors    state k (before step k), k = 0 … steps

Checkpoints are safetensors files — a JSON header and raw little-endian arrays — so loading
one never executes anything (no pickle). A checkpoint is trusted only after the state hash
recomputed from it equals the manifest's h_k (see :mod:`.replay`).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from safetensors.numpy import load as load_safetensors
from safetensors.numpy import save as save_safetensors

from open1b.protocol import RunManifest, TensorBytes, batch_digest, genesis, state_hash
from open1b.protocol.messages import MAX_MANIFEST_SIZE

from .config import GPTConfig
from .errors import RunFormatError
from .state import TrainState

ENGINE = "open1b-gpt"
ENGINE_VERSION = "0.2.0"
DATA_ORDER = "open1b/data/v1"
CORPUS_NAME = "builtin-v1"

MANIFEST_FILE = "manifest.cbor"
CHECKPOINT_DIR = "checkpoints"
CHECKPOINT_HEADER_SLACK = 1 << 20
"""Bytes allowed for a checkpoint's safetensors header beyond its tensors' data."""


def checkpoint_path(run_dir: Path, step: int) -> Path:
    return run_dir / CHECKPOINT_DIR / f"{step:08d}.safetensors"


def as_tensor_bytes(array: np.ndarray) -> TensorBytes:
    little = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    return TensorBytes(str(little.dtype.name), tuple(int(d) for d in little.shape), little.tobytes())


def state_tensor_bytes(state: TrainState) -> dict[str, TensorBytes]:
    return {name: as_tensor_bytes(a) for name, a in state.tensors().items()}


def step_batch_digest(batch: np.ndarray) -> bytes:
    """Digest of the batch one step consumed: ``batch`` is (ranks, micro_batches, rows, T + 1)
    and each rank's share ``batch[r]`` is one entry of the protocol's per-rank list, in rank order."""
    return batch_digest([as_tensor_bytes(batch[rank]) for rank in range(batch.shape[0])])


def genesis_hash(manifest_fields: dict) -> bytes:
    keys = ("engine", "engine_version", "model", "data", "seed")
    return genesis({k: manifest_fields[k] for k in keys})


def next_state_hash(prev: bytes, state: TrainState, batch: np.ndarray | None) -> bytes:
    """h_k for ``state`` (at step k), given h_{k-1} (or the genesis hash) and the batch of step k-1."""
    consumed = step_batch_digest(batch) if batch is not None else bytes(32)
    return state_hash(prev, state.step, state_tensor_bytes(state), consumed)


def write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_checkpoint(run_dir: Path, state: TrainState) -> None:
    data = save_safetensors(dict(state.tensors()), metadata={"format": "open1b-checkpoint", "step": str(state.step)})
    write_atomic(checkpoint_path(run_dir, state.step), data)


def max_checkpoint_bytes(config: GPTConfig) -> int:
    """The largest checkpoint file of ``config``'s state: parameters and two moments (float32),
    the two bias-correction powers, and :data:`CHECKPOINT_HEADER_SLACK` for the header."""
    return 4 * (3 * config.n_params() + 2) + CHECKPOINT_HEADER_SLACK


def load_checkpoint(run_dir: Path, step: int, config: GPTConfig) -> TrainState:
    """State ``step`` of the run; refused before parsing when the file is larger than its config allows."""
    path = checkpoint_path(run_dir, step)
    try:
        size = path.stat().st_size
        if size > max_checkpoint_bytes(config):
            raise RunFormatError(f"{path}: {size} bytes exceeds the checkpoint limit")
        tensors = load_safetensors(path.read_bytes())
    except RunFormatError:
        raise
    except Exception as exc:
        raise RunFormatError(f"cannot read checkpoint {path}: {exc}") from exc
    try:
        return TrainState.from_tensors(tensors, step, config)
    except ValueError as exc:
        raise RunFormatError(f"{path}: {exc}") from exc


def read_manifest(run_dir: Path) -> RunManifest:
    path = Path(run_dir) / MANIFEST_FILE
    try:
        data = path.read_bytes()[: MAX_MANIFEST_SIZE + 1]
    except OSError as exc:
        raise RunFormatError(f"no run at {run_dir}: {exc}") from exc
    return RunManifest.decode(data)
