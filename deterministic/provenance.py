"""Which samples step k used, with a proof of each against the run's ``samples_root``.

:func:`prove_step_samples` answers from a dataset and a root, so it can be used (and tested)
without a run directory; :func:`run_step_samples` answers for a run directory, reading only
what its signed manifest commits to.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from open1b.protocol import RunManifest
from open1b.protocol.merkle import verify_merkle_proof

from .config import Topology, from_manifest_model
from .data import DATA_ORDER, TOKENIZER, TOKENIZER_VOCAB, step_sample_indices
from .errors import RunFormatError, SamplesMismatchError
from .runfile import SAMPLES_FILE, read_manifest
from .samples import Dataset, read_samples, write_samples


@dataclass(frozen=True)
class SampleUse:
    """Row ``row`` of micro-batch ``micro_batch`` of rank ``rank`` held sample ``index``, whose
    digest is ``digest``; ``proof`` is its Merkle audit path (leaf level first)."""

    rank: int
    micro_batch: int
    row: int
    index: int
    digest: bytes
    proof: tuple[bytes, ...]

    def to_json(self) -> dict:
        return {"rank": self.rank, "micro_batch": self.micro_batch, "row": self.row, "index": self.index,
                "digest": self.digest.hex(), "proof": [p.hex() for p in self.proof]}  # fmt: skip


@dataclass(frozen=True)
class StepSamples:
    """Every sample step ``step`` used (of one rank, or of all), each proven against ``root``."""

    step: int
    samples: int  # N, the size of the committed tree
    root: bytes
    uses: tuple[SampleUse, ...]

    def to_json(self) -> dict:
        return {"step": self.step, "samples": self.samples, "samples_root": self.root.hex(),
                "verified": True, "uses": [u.to_json() for u in self.uses]}  # fmt: skip


def prove_step_samples(
    dataset: Dataset, seed: int, step: int, topology: Topology, root: bytes, *, rank: int | None = None
) -> StepSamples:
    """The samples of step ``step`` (only rank ``rank``'s when given), each with its proof, every
    proof checked against ``root`` before it is returned: :class:`SamplesMismatchError` if the
    dataset is not the one ``root`` commits to."""
    if rank is not None and not 0 <= rank < topology.ranks:
        raise ValueError(f"rank {rank} is outside the run's {topology.ranks} ranks")
    indices = step_sample_indices(seed, step, topology, dataset.n)
    proofs: dict[int, tuple[bytes, ...]] = {}  # a sample drawn twice is proven once
    uses = []
    for r in range(topology.ranks) if rank is None else (rank,):
        for m in range(topology.micro_batches):
            for j in range(topology.micro_batch_size):
                i = int(indices[r, m, j])
                if i not in proofs:
                    proofs[i] = tuple(dataset.proof(i))
                    if not verify_merkle_proof(dataset.digests[i], i, dataset.n, proofs[i], root):
                        raise SamplesMismatchError(f"sample {i} does not verify against samples_root {root.hex()}")
                uses.append(SampleUse(r, m, j, i, dataset.digests[i], proofs[i]))
    return StepSamples(step, dataset.n, root, tuple(uses))


def write_run_samples(run_dir: Path, dataset: Dataset) -> dict:
    """Write ``RUN/samples.bin``; returns the manifest fields that commit to it (§1, §4)."""
    path = Path(run_dir) / SAMPLES_FILE
    address = write_samples(path, dataset)
    return {"samples_root": dataset.root, "samples": dataset.n, "samples_blob": address,
            "samples_size": path.stat().st_size}  # fmt: skip


def load_run_samples(run_dir: Path, manifest: RunManifest) -> Dataset:
    """``RUN/samples.bin``, accepted only if its size, blob address, count, sample length and
    Merkle root are the ones the manifest names."""
    _, config, _ = from_manifest_model(dict(manifest.model))
    return read_samples(
        Path(run_dir) / SAMPLES_FILE, expected_root=manifest.samples_root, expected_count=manifest.samples,
        expected_sample_len=config.seq_len + 1, vocab_size=TOKENIZER_VOCAB, expected_digest=manifest.samples_blob,
        expected_size=manifest.samples_size,
    )  # fmt: skip


# A worker checks many steps of a run, by replay and by spot check, each in a working directory
# of its own whose samples.bin is a link to the one stored blob. Verifying the file (a Merkle root
# over every sample: ~0.2 s for `tiny`'s 31,244 samples, 90% of a `tiny` spot check) once per
# file and commitment, not once per step, keeps the cheap check cheap. The key is the file's
# identity (a tampered copy or a rewrite is read again) and everything the manifest commits.
CHECKED_SAMPLES_KEPT = 2  # runs whose checked samples a process keeps
_CHECKED_SAMPLES: OrderedDict[tuple, Dataset] = OrderedDict()


def checked_run_samples(run_dir: Path, manifest: RunManifest) -> Dataset:
    """:func:`load_run_samples`, from a per-process cache when this very file was checked
    against these commitments before."""
    path = Path(run_dir) / SAMPLES_FILE
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return load_run_samples(run_dir, manifest)  # which says what is wrong with the file
    _, config, _ = from_manifest_model(dict(manifest.model))
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, manifest.samples_blob,
           manifest.samples_root, manifest.samples, manifest.samples_size, config.seq_len)
    if key in _CHECKED_SAMPLES:
        _CHECKED_SAMPLES.move_to_end(key)
        return _CHECKED_SAMPLES[key]
    dataset = _CHECKED_SAMPLES[key] = load_run_samples(run_dir, manifest)
    while len(_CHECKED_SAMPLES) > CHECKED_SAMPLES_KEPT:
        _CHECKED_SAMPLES.popitem(last=False)
    return dataset


def run_step_samples(run_dir: Path, step: int, *, rank: int | None = None) -> tuple[RunManifest, StepSamples]:
    """The run's manifest and :func:`prove_step_samples` for step ``step`` of the run in ``run_dir``."""
    manifest = read_manifest(Path(run_dir))
    if not 0 <= step < manifest.steps:
        raise RunFormatError(f"step {step} is outside the run's {manifest.steps} steps")
    # Indices mean something only under this order and tokenizer; another rule would "prove" the wrong rows.
    order, tokenizer = manifest.data.get("order"), manifest.data.get("tokenizer")
    if (order, tokenizer) != (DATA_ORDER, TOKENIZER):
        raise RunFormatError(f"run uses data order {order!r} and tokenizer {tokenizer!r}; this node knows"
                             f" {DATA_ORDER!r} with {TOKENIZER!r}")
    _, _, topology = from_manifest_model(dict(manifest.model))
    dataset = load_run_samples(run_dir, manifest)
    return manifest, prove_step_samples(dataset, manifest.seed, step, topology, manifest.samples_root, rank=rank)
