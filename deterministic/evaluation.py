"""Certified evaluation (docs/run-format.md §9): the loss of a run's state on its held-out set.

The evaluation loss of state k is the mean next-token cross-entropy over every target token of
the E evaluation samples, computed by the engine's own step kernels: the samples form one batch of
topology (1 rank, E micro-batches, 1 row) and :func:`.step.step_gradients` folds the E micro-batch
losses, each scaled by 1 / (E·T), in ascending order from +0.0. Reusing the step's fold (and
discarding its gradients) costs a backward pass per sample, but there is no second loss code
path whose order could drift from the training step's, so every replayer gets the trainer's bits.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from open1b.protocol import RunManifest

from .backend import default_backend
from .config import Topology, from_manifest_model
from .data import builtin_eval_dataset
from .documents import KEY_EVAL_DOCUMENTS, KEY_EVAL_EVERY, KEY_EVAL_ROOT, KEY_EVAL_SAMPLES
from .errors import RunFormatError, SamplesMismatchError
from .checkpoint_stream import scan_checkpoint, scanned_state
from .runfile import checkpoint_path
from .samples import Dataset
from .state import TrainState
from .step import step_gradients


def eval_schedule(steps: int, every: int) -> list[int]:
    """The states a run evaluates: k = every, 2·every, … ≤ steps (state k is after step k − 1)."""
    if every < 1:
        raise ValueError(f"eval_every must be at least 1, not {every}")
    return list(range(every, steps + 1, every))


def eval_fields(dataset: Dataset, held_out: int, every: int) -> dict[str, int | str]:
    """The manifest ``data`` keys that commit to an evaluation set and schedule before training."""
    return {KEY_EVAL_DOCUMENTS: held_out, KEY_EVAL_SAMPLES: dataset.n, KEY_EVAL_ROOT: dataset.root.hex(),
            KEY_EVAL_EVERY: every}  # fmt: skip


def eval_loss(state: TrainState, dataset: Dataset, *, backend=None) -> np.float32:
    """The float32 evaluation loss of ``state`` on ``dataset`` (module doc)."""
    e, sample_len = dataset.n, dataset.sample_len
    batch = dataset.samples.astype(np.int32).reshape(1, e, 1, sample_len)
    be = backend or default_backend(state.config)
    loss, _ = step_gradients(state, batch, Topology(ranks=1, micro_batches=e, micro_batch_size=1), be)
    return np.float32(be.download(loss)[0])  # a (1,) array on the backend (deterministic/step.py)


def loss_bits(loss: np.float32) -> int:
    """The float32 bit pattern an ``eval`` statement carries (docs/protocol.md §5.3)."""
    return int(np.array([loss], np.float32).view(np.uint32)[0])


def run_eval_dataset(manifest: RunManifest) -> Dataset:
    """The run's evaluation samples, rebuilt from the shipped corpus and checked against the
    manifest's ``eval_root``; :class:`RunFormatError` if the run commits to no evaluation."""
    data = manifest.data
    try:
        held_out, count, root = data[KEY_EVAL_DOCUMENTS], data[KEY_EVAL_SAMPLES], data[KEY_EVAL_ROOT]
    except KeyError as exc:
        raise RunFormatError(f"the run commits to no evaluation set ({exc})") from exc
    _, config, _ = from_manifest_model(dict(manifest.model))
    dataset = builtin_eval_dataset(config, held_out)
    if (dataset.n, dataset.root.hex()) != (count, root):
        raise SamplesMismatchError("the shipped corpus does not give the run's evaluation set")
    return dataset


def evaluate_state(run_dir: Path, manifest: RunManifest, k: int, *, backend=None) -> np.float32:
    """The evaluation loss of state ``k`` of the run in ``run_dir``. Checkpoint k is used only when
    its bytes have the address the manifest signs (``checkpoints[k]``): the evaluation is of the
    state the run published, and whether that state is h_k is the replays' question, not this one.
    The file is read once in pieces, its parameters kept (:func:`.checkpoint_stream.scan_checkpoint`):
    its moments are never in memory on the CPU."""
    every = manifest.data.get(KEY_EVAL_EVERY)
    if type(every) is not int or k not in eval_schedule(manifest.steps, every):
        raise RunFormatError(f"state {k} is not on the run's evaluation schedule")
    _, config, _ = from_manifest_model(dict(manifest.model))
    scan = scan_checkpoint(checkpoint_path(Path(run_dir), k), config, k, manifest.checkpoints[k])
    return eval_loss(scanned_state(scan, config, k), run_eval_dataset(manifest), backend=backend)
