"""A checkpoint file's layout and its chunk table: what lets a fetcher check every 1 MiB chunk of a
checkpoint on arrival against the published h_k (docs/run-format.md §6.6).

* **Layout.** A checkpoint is a safetensors file (§2): ``u64le(n) ‖ JSON header of n bytes ‖ data``.
  :func:`parse_layout` reads the header with bounds (``deterministic/safetensors_header.py``: n ≤
  1 MiB, every tensor's byte range inside the data, the ranges tiling the data with no gap or
  overlap, so every data byte belongs to exactly one tensor chunk); :func:`check_layout` then requires exactly the names, dtypes, shapes
  and step metadata that the run's model implies.
* **Chunk table.** The chunk digests of every tensor (§3.2), tensors in state-tree order (their
  names' UTF-8 bytes), chunks in index order, 32 bytes each. Any holder of the file computes it
  (:func:`compute_table`); a fetcher accepts it only when the tensor roots, tensor digests and
  state root it implies hash, with h_k's other preimage fields, to the published h_k
  (:func:`verify_table`). From then on a chunk is checked by hashing it alone.

The tree rules of §3 are restated here from the digests up (``protocol.commitments`` computes
them only from whole tensors, and keeps these steps private); ``tests/node/test_chunk_table.py``
checks that both give the same h for a real state.
"""

from __future__ import annotations

import os
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import nacl.hashlib

from open1b.deterministic import safetensors_header
from open1b.deterministic.config import GPTConfig, from_manifest_model
from open1b.deterministic.data import batch_for_step
from open1b.deterministic.runfile import (
    CHECKPOINT_HEADER_SLACK,
    CHECKPOINT_METADATA_KEY,
    genesis_hash,
    lr_bits,
    max_checkpoint_bytes,
    state_tensor_bytes,
    step_batch_digest,
)
from open1b.deterministic.samples import Dataset
from open1b.deterministic.state import TrainState
from open1b.protocol import Open1bError, RunManifest, state_hash
from open1b.protocol.commitments import CHUNK_SIZE
from open1b.protocol.hashing import DIGEST_SIZE, blake2b256
from open1b.protocol.merkle import merkle_root

HEADER_PREFIX = safetensors_header.PREFIX
_CHUNK_TAG = b"open1b/chunk/v2\x00"
_TENSOR_TAG = b"open1b/tensor/v2\x00"
_STATE_TAG = b"open1b/state/v2\x00"


class ChunkTableError(Open1bError):
    """A file is not a checkpoint of the expected shape, or a chunk table does not prove h_k."""


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str  # the protocol's name: "float32", …
    shape: tuple[int, ...]
    start: int  # absolute offset of its first byte in the file
    nbytes: int

    @property
    def chunks(self) -> int:
        return max(1, -(-self.nbytes // CHUNK_SIZE))  # a zero-byte tensor has one empty chunk


@dataclass(frozen=True)
class Piece:
    """One chunk of one tensor as a byte range of the file, and where its digest sits in the table."""

    offset: int
    length: int
    chunk: int  # its index within the tensor
    slot: int  # its index in the chunk table


@dataclass(frozen=True)
class Layout:
    header_size: int  # 8 + n: the bytes before the data section
    tensors: tuple[Tensor, ...]  # in state-tree order
    metadata: dict[str, str]
    size: int  # the whole file

    def pieces(self) -> list[Piece]:
        """Every chunk of every tensor, in file order (so a download writes and hashes forward)."""
        out, slot = [], 0
        for t in self.tensors:
            for i in range(t.chunks):
                out.append(Piece(t.start + i * CHUNK_SIZE, min(CHUNK_SIZE, t.nbytes - i * CHUNK_SIZE), i, slot))
                slot += 1
        return sorted(out, key=lambda p: p.offset)

    @property
    def table_size(self) -> int:
        return DIGEST_SIZE * sum(t.chunks for t in self.tensors)


def header_length(prefix: bytes) -> int:
    """``n`` from a file's first 8 bytes, refused beyond the checkpoint header bound."""
    try:
        return safetensors_header.header_length(prefix, CHECKPOINT_HEADER_SLACK)
    except safetensors_header.HeaderError as exc:
        raise ChunkTableError(str(exc)) from None


def parse_layout(header: bytes, size: int) -> Layout:
    """The layout of a ``size``-byte safetensors file whose first bytes are ``header`` (the 8-byte
    length and the JSON header, exactly): :func:`open1b.deterministic.safetensors_header.parse`,
    the one bounded parser, with tensors in state-tree order."""
    try:
        entries, metadata = safetensors_header.parse(header, size, CHECKPOINT_HEADER_SLACK)
    except safetensors_header.HeaderError as exc:
        raise ChunkTableError(str(exc)) from None
    tensors = sorted((Tensor(e.name, e.dtype, e.shape, e.offset, e.nbytes) for e in entries), key=lambda t: t.name.encode())
    return Layout(len(header), tuple(tensors), metadata, size)


def expected_shapes(config: GPTConfig) -> dict[str, tuple[int, ...]]:
    """Name → shape of every tensor of ``config``'s training state (``TrainState.tensors()``)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for prefix in ("param", "adam_m", "adam_v"):
        for name, shape in config.param_shapes().items():
            shapes[f"{prefix}/{name}"] = tuple(shape)
    shapes["adam/beta1_pow"] = shapes["adam/beta2_pow"] = (1,)
    return shapes


def check_layout(layout: Layout, shapes: Mapping[str, tuple[int, ...]], step: int) -> None:
    """Refuse a layout that is not state ``step`` of a model with these tensor ``shapes`` (all float32)."""
    got = {t.name: t.shape for t in layout.tensors}
    if got != dict(shapes):
        unknown, missing = sorted(set(got) - set(shapes)), sorted(set(shapes) - set(got))
        raise ChunkTableError(f"tensors differ from the model's: unknown {unknown[:3]}, missing {missing[:3]}, "
                              f"or a shape differs")
    if any(t.dtype != "float32" for t in layout.tensors):
        raise ChunkTableError("a checkpoint's tensors are float32")
    if layout.metadata != {CHECKPOINT_METADATA_KEY: str(step)}:
        raise ChunkTableError(f"header metadata {layout.metadata!r} is not that of checkpoint {step}")


def read_layout(path: Path) -> Layout:
    """The layout of the safetensors file at ``path`` (bounded reads only)."""
    with open(path, "rb") as f:
        prefix = f.read(HEADER_PREFIX)
        header = prefix + f.read(header_length(prefix))
        return parse_layout(header, os.fstat(f.fileno()).st_size)


# -- the tree of docs/run-format.md §3, from chunk digests up --------------------------------
def fast_blake2b() -> nacl.hashlib.blake2b:
    """An unkeyed BLAKE2b-256 hasher from libsodium: the same function as hashlib's, so the same
    bits, ~11% less CPU per byte on the build machine (its AVX2 code), and it releases the GIL.
    It takes ``bytes`` only. Used on the two hot passes of a transfer (chunk digests, address)."""
    return nacl.hashlib.blake2b(digest_size=DIGEST_SIZE)


def chunk_digest(index: int, chunk: bytes) -> bytes:
    """§3.2: B2("open1b/chunk/v2\\0" ‖ u64le(i) ‖ c)."""
    h = fast_blake2b()
    h.update(_CHUNK_TAG + struct.pack("<Q", index))
    h.update(chunk)
    return h.digest()


def _tensor_digest(t: Tensor, root: bytes) -> bytes:
    name = t.name.encode()
    return blake2b256(_TENSOR_TAG, struct.pack("<H", len(name)), name, struct.pack("<B", len(t.dtype)),
                      t.dtype.encode(), struct.pack("<B", len(t.shape)), struct.pack(f"<{len(t.shape)}Q", *t.shape),
                      struct.pack("<Q", t.nbytes), root)


def table_state_hash(layout: Layout, table: bytes, prev: bytes, step: int, lr: int, batch: bytes) -> bytes:
    """h of the state whose chunk digests are ``table`` (§3.3)."""
    if len(table) != layout.table_size:
        raise ChunkTableError(f"a chunk table of {len(table)} bytes for {layout.table_size // DIGEST_SIZE} chunks")
    digests, at = [], 0
    for t in layout.tensors:
        chunks = [table[at + DIGEST_SIZE * i:at + DIGEST_SIZE * (i + 1)] for i in range(t.chunks)]
        digests.append(_tensor_digest(t, merkle_root(chunks)))
        at += DIGEST_SIZE * t.chunks
    return blake2b256(_STATE_TAG, prev, struct.pack("<QI", step, lr), batch, struct.pack("<I", len(digests)),
                      merkle_root(digests))


def compute_table(path: Path, workers: int | None = None) -> bytes:
    """The chunk table of the checkpoint at ``path``, hashed on ``workers`` threads (BLAKE2b and
    ``pread`` release the GIL), one chunk in memory per thread: never the whole file."""
    layout = read_layout(path)
    slots = bytearray(layout.table_size)
    fd = os.open(path, os.O_RDONLY)
    try:
        def job(p: Piece) -> None:
            slots[DIGEST_SIZE * p.slot:DIGEST_SIZE * (p.slot + 1)] = chunk_digest(p.chunk, os.pread(fd, p.length, p.offset))

        with ThreadPoolExecutor(workers or os.cpu_count() or 1) as pool:
            list(pool.map(job, layout.pieces()))
    finally:
        os.close(fd)
    return bytes(slots)


# -- what a fetcher expects of checkpoint k ------------------------------------------------------
@dataclass(frozen=True)
class Expectation:
    """Everything a fetcher checks checkpoint ``step`` against: its file address and size bound,
    its tensors' shapes, and h_k with the rest of h_k's preimage."""

    address: bytes
    max_size: int
    shapes: Mapping[str, tuple[int, ...]]
    step: int
    state_hash: bytes
    prev: bytes
    lr_bits: int
    batch_digest: bytes

    def check_table(self, layout: Layout, table: bytes) -> None:
        """Refuse a chunk table that does not prove the published h_k."""
        if table_state_hash(layout, table, self.prev, self.step, self.lr_bits, self.batch_digest) != self.state_hash:
            raise ChunkTableError(f"the chunk table does not hash to h_{self.step}")


def state_expectation(state: TrainState, address: bytes, *, prev: bytes, batch_digest: bytes = bytes(DIGEST_SIZE),
                      lr: int = 0) -> Expectation:
    """What a fetcher expects of the checkpoint of ``state`` stored at ``address``, whose h is
    chained from ``prev`` (for a state outside any run: tests and benchmarks)."""
    h = state_hash(prev, state.step, state_tensor_bytes(state), batch_digest, lr_bits=lr)
    return Expectation(address, max_checkpoint_bytes(state.config), expected_shapes(state.config), state.step, h,
                       prev, lr, batch_digest)


def checkpoint_expectation(manifest: RunManifest, step: int, dataset: Dataset | None) -> Expectation:
    """What checkpoint ``step`` of ``manifest`` must be. ``dataset`` is the run's verified samples
    (``deterministic.provenance.load_run_samples``): h_k commits to the batch step k−1 consumed,
    which a fetcher recomputes rather than takes from a provider; None is allowed for step 0."""
    _, config, topology = from_manifest_model(dict(manifest.model))
    if step == 0:
        prev, lr, batch = genesis_hash(manifest.body()), 0, bytes(DIGEST_SIZE)
    else:
        if dataset is None:
            raise ValueError("checkpoint k > 0 needs the run's samples to recompute h_k's batch digest")
        prev, lr = manifest.state_hashes[step - 1], lr_bits(config)
        batch = step_batch_digest(batch_for_step(dataset, manifest.seed, step - 1, config, topology))
    return Expectation(manifest.checkpoints[step], max_checkpoint_bytes(config), expected_shapes(config), step,
                       manifest.state_hashes[step], prev, lr, batch)
