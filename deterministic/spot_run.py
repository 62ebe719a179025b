"""Spot checks of a run directory (docs/run-format.md §10.2): the trainer's answer to a challenge,
and the verifier's check of it. The two functions the node calls.

* :func:`answer_from_run` — the trainer's side: from its own run directory, recompute step k
  once and open the challenged chunks (:func:`.fingerprint.answer_challenge`), encoded as the
  canonical CBOR *answer* below, at most :data:`MAX_ANSWER_SIZE` bytes.
* :func:`check_spot` — the verifier's side: from a run directory holding the manifest, the
  samples file, checkpoints k and k+1 (whole, or only the chunks a check reads: :mod:`.spot_state`)
  and ``fingerprints.cbor``, and its two challenge signatures
  (the chunks' and the secret slot's), run the links of §10.2 in order and report the first that
  breaks (a :class:`SpotResult`, whose fields are those of the ``spotcheck`` statement).

Everything is untrusted: the manifest is decoded and authenticated, the fingerprints file is
size-bounded before it is read and checked against both of the manifest's commitments, each
checkpoint against its address and recomputed state hash, and the answer (the trainer's bytes)
is size-bounded, decoded as canonical CBOR and shape-checked before any arithmetic; a malformed
answer is a ``fail`` caught by ``proof``, never an exception. An answer opens no commitment: its
chunks bind the answerer, and the trainer only when the trainer answered (docs/protocol.md §5.5
says who may sign a ``fail`` of the answer's links). What the verifier cannot judge —
its own files missing or not the run's, a run without fingerprints, another engine — raises
(:class:`SpotInputError` and the replayer's errors), and the caller signs nothing.

The answer::

    {"step": k, "openings": [{"chunk": c, "micro": [f32le bytes, … one per slot], "summed": f32le bytes}, …]}

one opening per challenged chunk, in the challenge's (ascending) order.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from open1b.protocol import RunManifest, encode
from open1b.protocol.codec import decode
from open1b.protocol.errors import ProtocolError
from open1b.protocol.fingerprints import FINGERPRINTS_FILE, committed, decode_fingerprints, max_fingerprints_size
from open1b.protocol.hashing import blake2b256
from open1b.protocol.spotcheck import FAIL, MAX_ANSWER_SIZE, PASS, derive_chunks, derive_slot

from .bounded_read import FileRefused, read_bounded
from .checkpoint_stream import FileMoments, file_state, scan_checkpoint, scanned_state
from .config import GPTConfig, Topology
from .data import batch_for_step
from .device import DeviceChoice
from .errors import CheckpointMismatchError, RunFormatError
from .fingerprint import CHUNK_ELEMENTS, Caught, ChunkOpening, StepFingerprint, answer_challenge, check_chunks
from .fingerprint import check_loss_sum, chunk_count, recompute_slot
from .provenance import checked_run_samples
from .replay import backend_on, check_data_rules, check_engine
from .runfile import checkpoint_path, genesis_hash, hash_of_link, link_of_root, lr_bits, read_manifest
from .runfile import step_batch_digest
from .samples import Dataset
from .spot_state import PartState, open_part, part_paths
from .state import TrainState
from .trainer import config_of

__all__ = ["ANSWER", "MAX_ANSWER_SIZE", "MICRO", "SpotInputError", "SpotResult", "answer_from_run", "check_spot",
           "decode_answer", "encode_answer", "load_fingerprints"]

_F32 = np.dtype("<f4")


class SpotInputError(RunFormatError):
    """The verifier's (or trainer's) own run directory cannot serve this spot check: the run commits
    to no fingerprints, the fingerprints file is not the one it commits to, the step is outside
    the run, or the run has too many slots for an answer to fit :data:`MAX_ANSWER_SIZE`."""


@dataclass(frozen=True)
class SpotResult:
    """What one spot check found, with the ``spotcheck`` statement's fields (docs/protocol.md §5.3)."""

    run: bytes
    step: int
    pre_state: bytes  # h_step: checkpoint k was checked against it
    fingerprint: bytes  # F_step, the fingerprint checked against
    slot: int  # the (rank · micro_batches + micro-batch) recomputed
    chunks: tuple[int, ...]  # the gradient chunks opened (or asked for, with no answer)
    chunks_total: int
    caught: str  # one of protocol.spotcheck.CAUGHT: the first link that broke, "none" for a pass
    elapsed_ms: int
    recomputed: bytes = b""  # the micro half's f32le chunks of the slot's gradient, for the answer half

    @property
    def passed(self) -> bool:
        return self.caught == Caught.NONE.value

    @property
    def verdict(self) -> str:
        return PASS if self.passed else FAIL


@dataclass(frozen=True)
class _Run:
    """A run directory's checked manifest and what its steps are computed from."""

    dir: Path
    manifest: RunManifest
    config: GPTConfig
    topology: Topology
    dataset: Dataset

    @property
    def slots(self) -> int:
        return self.topology.ranks * self.topology.micro_batches

    def batch(self, step: int) -> np.ndarray:
        return batch_for_step(self.dataset, self.manifest.seed, step, self.config, self.topology)

    def state(self, k: int, *, params: bool = True) -> TrainState | PartState:
        """Checkpoint k, accepted only with its address and its recomputed h_k (run-format §2); or,
        where the directory holds it only in part (a spot check's fetch: :mod:`.spot_state`), its
        held chunks, accepted only with a chunk table that proves h_k (``params``: read all its
        parameters now, as a recomputation needs)."""
        prev = genesis_hash(self.manifest.body()) if k == 0 else self.manifest.state_hashes[k - 1]
        if not checkpoint_path(self.dir, k).exists() and part_paths(self.dir, k)[0].exists():
            link = (prev, 0, bytes(32)) if k == 0 else (prev, lr_bits(self.config), step_batch_digest(self.batch(k - 1)))
            return open_part(self.dir, k, self.config, self.manifest.state_hashes[k], link, params=params)
        # read once in pieces and hashed on the way (its address and h_k); the parameters kept, the
        # moments read back a tensor at a time, chunk-checked, when a link uses them: never the file whole
        scan = scan_checkpoint(checkpoint_path(self.dir, k), self.config, k, self.manifest.checkpoints[k],
                               keep="param/" if params else None)
        link = link_of_root(self.config, k, self.batch(k - 1) if k > 0 else None, scan.state_root())
        if hash_of_link(prev, link) != self.manifest.state_hashes[k]:
            raise CheckpointMismatchError(f"checkpoint {k} does not hash to the published h_{k}")
        if params:
            return scanned_state(scan, self.config, k)
        names = list(self.config.param_shapes())
        return file_state(self.config, k, scan.path, scan.slots, scan.digests,
                          FileMoments(scan.path, "param", scan.slots, scan.digests, names))


def _open_run(run_dir: Path, step: int, device: DeviceChoice | None):
    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir)
    check_engine(manifest)
    check_data_rules(manifest)
    if type(step) is not int or not 0 <= step < manifest.steps:
        raise SpotInputError(f"step {step!r} is outside the run's {manifest.steps} steps")
    config, topology = config_of(manifest)
    backend = backend_on(device, config)
    return _Run(run_dir, manifest, config, topology, checked_run_samples(run_dir, manifest)), backend


def load_fingerprints(run_dir: Path, manifest: RunManifest) -> list[StepFingerprint]:
    """``RUN/fingerprints.cbor``, accepted only when it is no larger than the run allows (checked
    before reading), its BLAKE2b-256 is the manifest's ``fingerprints_blob`` and its entries'
    Merkle root the manifest's ``fingerprints_root``."""
    try:
        commitments = committed(manifest.data)
    except ProtocolError as exc:  # a decoded manifest has passed this rule already
        raise SpotInputError(str(exc)) from None
    if commitments is None:
        raise SpotInputError("the run commits to no fingerprints: it cannot be spot checked")
    root, blob = commitments
    _, topology = config_of(manifest)
    slots = topology.ranks * topology.micro_batches
    path, limit = Path(run_dir) / FINGERPRINTS_FILE, max_fingerprints_size(manifest.steps, slots)
    try:
        data = read_bounded(path, limit)
    except FileRefused as exc:
        raise SpotInputError(f"cannot read {FINGERPRINTS_FILE} (at most {limit} bytes): {exc}") from None
    if blake2b256(data) != blob:
        raise SpotInputError(f"{FINGERPRINTS_FILE} is not the file the manifest names (fingerprints_blob)")
    try:
        entries = decode_fingerprints(data, steps=manifest.steps, slots=slots, root=root)
    except ProtocolError as exc:
        raise SpotInputError(f"{FINGERPRINTS_FILE}: {exc}") from None
    return [_step_fingerprint(e) for e in entries]


def _step_fingerprint(entry: dict) -> StepFingerprint:
    # StepFingerprint.value() gives back exactly ``entry``, so its commitment is the committed F_k
    return StepFingerprint(entry["step"], tuple(entry["losses"]), entry["loss"], entry["grad_norm"],
                           entry["clip_coef"])


def _chunks(run: _Run, challenge: bytes) -> tuple[tuple[int, ...], int]:
    if not isinstance(challenge, bytes):
        raise TypeError("a challenge is the verifier's signature bytes")
    total = chunk_count(run.config)
    return derive_chunks(challenge, total), total


# -- the answer --------------------------------------------------------------------------------
def encode_answer(step: int, openings: tuple[ChunkOpening, ...]) -> bytes:
    return encode({"step": step, "openings": [
        {"chunk": op.index, "micro": [np.ascontiguousarray(a, _F32).tobytes() for a in op.micro],
         "summed": np.ascontiguousarray(op.summed, _F32).tobytes()}
        for op in openings]})  # fmt: skip


class _Malformed(Exception):
    pass


def decode_answer(answer: Any, step: int, chunks: tuple[int, ...], slots: int, n_params: int) -> tuple[ChunkOpening, ...]:
    """The openings of an answer to a challenge of ``chunks`` of step ``step``; ``None`` when the
    bytes are not such an answer (too large, not canonical CBOR, another step or other chunks,
    arrays of the wrong length)."""
    try:
        if not isinstance(answer, bytes):
            raise _Malformed
        value = decode(answer, max_size=MAX_ANSWER_SIZE)
        _expect(type(value) is dict and set(value) == {"step", "openings"} and value["step"] == step
                and type(value["step"]) is int and type(value["openings"]) is list
                and len(value["openings"]) == len(chunks))
        return tuple(_opening(v, c, slots, n_params) for v, c in zip(value["openings"], chunks))
    except (_Malformed, ProtocolError):
        return None


def _expect(condition: bool) -> None:
    if not condition:
        raise _Malformed


def _opening(value: Any, index: int, slots: int, n_params: int) -> ChunkOpening:
    _expect(type(value) is dict and set(value) == {"chunk", "micro", "summed"})
    length = 4 * min(CHUNK_ELEMENTS, n_params - index * CHUNK_ELEMENTS)
    micro = value["micro"]
    _expect(value["chunk"] == index and type(value["chunk"]) is int and type(micro) is list and len(micro) == slots)
    arrays = [*micro, value["summed"]]
    _expect(all(type(a) is bytes and len(a) == length for a in arrays))
    as_f32 = [np.frombuffer(a, _F32) for a in arrays]
    return ChunkOpening(index, tuple(as_f32[:-1]), as_f32[-1])


# -- the two sides -----------------------------------------------------------------------------
def answer_from_run(run_dir: Path, step: int, challenge: bytes, *, device: DeviceChoice | None = None) -> bytes:
    """The trainer's answer (canonical CBOR, module doc) to ``challenge`` of step ``step`` of its
    run in ``run_dir``: one recomputation of the step from checkpoint k (checked against h_k),
    keeping the chunks the challenge derives (docs/protocol.md §5.5). Raises
    :class:`SpotInputError` when the answer would exceed :data:`MAX_ANSWER_SIZE`."""
    run, backend = _open_run(run_dir, step, device)
    chunks, _ = _chunks(run, challenge)
    openings = answer_challenge(run.state(step), run.batch(step), run.topology, chunks, backend=backend)
    data = encode_answer(step, openings)
    if len(data) > MAX_ANSWER_SIZE:
        raise SpotInputError(f"an answer of {len(data)} bytes exceeds MAX_ANSWER_SIZE ({run.slots} slots)")
    return data


MICRO, ANSWER = "micro", "answer"
"""The two halves of a spot check (:func:`check_spot`'s ``links``): the links that need only the
verifier's files (``loss``, ``loss_sum``), and those that judge the trainer's answer (``proof``
for a malformed one, ``update``, ``gradient``, ``sum``, or ``no_answer``)."""


def check_spot(run_dir: Path, step: int, challenge: bytes, slot_challenge: bytes, answer: bytes | None, *,
               device: DeviceChoice | None = None, links: tuple[str, ...] = (MICRO, ANSWER),
               recomputed: bytes | None = None) -> SpotResult:
    """Spot check step ``step`` of the run in ``run_dir`` with the verifier's ``challenge`` and
    ``slot_challenge`` (its two signatures, docs/protocol.md §5.5) and the trainer's ``answer``
    (None: it did not answer in time). The links of docs/run-format.md §10.2 in order — the
    slot's ``loss``, ``loss_sum``, then the answer's chunks (``proof``, ``update``, ``gradient``,
    ``sum``) — and the first that breaks is ``caught``. The first two links need no answer, so a
    run they convict is reported by them even without one; otherwise a missing answer is
    ``no_answer``.

    ``links`` runs one half only: :data:`MICRO` (``none`` means those links held, and ``answer``
    is not read; the result's ``recomputed`` holds the slot's challenged chunks), or
    :data:`ANSWER` with that ``recomputed`` from a :data:`MICRO` call that held. A verifier checks
    the micro-batch while it waits for the answer, so a trainer that stalls its answer delays no
    verdict the micro-batch decides."""
    if not links or not set(links) <= {MICRO, ANSWER}:
        raise ValueError(f"links must be a non-empty subset of ({MICRO!r}, {ANSWER!r}), not {links!r}")
    if MICRO not in links and recomputed is None:
        raise ValueError("the answer half compares the answer with the micro half's recomputation")
    if not isinstance(slot_challenge, bytes):
        raise TypeError("a slot challenge is the verifier's signature bytes")
    started = time.perf_counter()
    run, backend = _open_run(run_dir, step, device)
    fp = load_fingerprints(run.dir, run.manifest)[step]
    chunks, total = _chunks(run, challenge)
    slot = derive_slot(slot_challenge, run.slots)
    before = run.state(step)
    caught = Caught.NONE
    if MICRO in links:
        caught, mine = recompute_slot(fp, before, run.batch(step), run.topology, slot, chunks, backend=backend)
        recomputed = b"".join(np.ascontiguousarray(m, _F32).tobytes() for m in mine)
        if caught is Caught.NONE:
            caught = check_loss_sum(fp, run.config, run.topology, backend=backend)
    if caught is Caught.NONE and ANSWER in links:
        if answer is None:
            caught = Caught.NO_ANSWER
        else:
            openings = decode_answer(answer, step, chunks, run.slots, run.config.n_params())
            caught = Caught.PROOF if openings is None else check_chunks(
                fp, openings, slot, _split(recomputed, openings), before, run.state(step + 1, params=False), run.topology,
                backend=backend)
    return SpotResult(run.manifest.run_id, step, run.manifest.state_hashes[step], fp.commitment, slot, chunks, total,
                      caught.value, int((time.perf_counter() - started) * 1000), recomputed)


def _split(recomputed: bytes, openings: tuple[ChunkOpening, ...]) -> tuple[np.ndarray, ...]:
    """The micro half's concatenated chunks, cut to the lengths of the opened chunks (the run's).
    Bytes of another length are the verifier's own input gone wrong: no verdict on the trainer."""
    sizes = [op.summed.nbytes for op in openings]
    if sum(sizes) != len(recomputed):
        raise SpotInputError("the micro half's recomputation does not fit the challenged chunks")
    cuts = [0, *itertools.accumulate(sizes)]
    return tuple(np.frombuffer(recomputed[a:b], _F32) for a, b in zip(cuts, cuts[1:]))
