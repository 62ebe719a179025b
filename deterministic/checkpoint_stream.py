"""Checkpoints read and written a tensor at a time, and hashed a chunk at a time.

A step of a large model cannot hold its old and new states whole: a ``gpt-1b`` state is 12 bytes
a parameter (the parameters and both AdamW moments in float32), 11 GB. A step needs only the
parameters whole (its forward and backward read them all); the update reads and writes the moments
one tensor at a time, and the state hash is a tree of 1 MiB chunks (docs/run-format.md §3). So:

* :func:`scan_checkpoint` reads a checkpoint file once, in order, :data:`PIECE_BYTES` at a time:
  the file's BLAKE2b-256 (its blob address) and every chunk digest of the state tree are computed
  on the way, the parameters are kept, the moments are not. h_k follows from the digests.
* :class:`FileMoments` reads one moment tensor back when the update asks for it, and checks each
  of its chunks against the scan's digests: the bytes the update uses are the bytes that were
  hashed, even if the file changed in between.
* :class:`StateSink` takes a new state a tensor at a time, hashes its chunks (on every core) and,
  when asked, writes it in place into a :class:`CheckpointWriter`'s file, whose bytes are exactly
  those :func:`.runfile.save_checkpoint` writes for the same state (so the same blob address).

Nothing here reads a file whole or holds more than one tensor of it beyond what the caller keeps.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from open1b.protocol.commitments import CHUNK_SIZE, chunk_digest, state_root_of_digests, tensor_digest_of_chunks
from open1b.protocol.hashing import DIGEST_SIZE

from . import safetensors_header
from .bounded_read import FileRefused, open_regular
from .config import GPTConfig
from .errors import CheckpointMismatchError, RunFormatError
from .process_pool import PerProcessPool
from .state import TrainState

PIECE_BYTES = 16 * CHUNK_SIZE
"""How much of a file is read or hashed at once (a whole number of state-tree chunks)."""
METADATA_KEY = "open1b_checkpoint_step"
HEADER_SLACK = 1 << 20
"""Bytes allowed for a checkpoint's safetensors header beyond its tensors' data."""
_PREFIX = 8  # u64le header length
_F32 = np.dtype("<f4")

_chunk_pool = PerProcessPool(os.cpu_count() or 1, "open1b-chunks")


def state_shapes(config: GPTConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of ``config``'s state under its name in ``TrainState.tensors()``, with its shape."""
    shapes = {f"{prefix}/{n}": tuple(s) for prefix in ("param", "adam_m", "adam_v")
              for n, s in config.param_shapes().items()}  # fmt: skip
    shapes["adam/beta1_pow"] = shapes["adam/beta2_pow"] = (1,)
    return shapes


def max_checkpoint_bytes(config: GPTConfig) -> int:
    """The largest checkpoint file of ``config``'s state: parameters and two moments (float32),
    the two bias-correction powers, and :data:`HEADER_SLACK` for the header."""
    return 4 * (3 * config.n_params() + 2) + HEADER_SLACK


@dataclass(frozen=True)
class Slot:
    """Where one tensor's raw bytes lie in a checkpoint file."""

    shape: tuple[int, ...]
    offset: int  # from the start of the file
    nbytes: int


def canonical_header(config: GPTConfig, step: int) -> tuple[bytes, dict[str, Slot]]:
    """The 8-byte length and JSON header that safetensors' writer gives checkpoint ``step`` of
    ``config`` (metadata first, tensors sorted by name, all float32, compact JSON, spaces to a
    multiple of 8 bytes), and each tensor's slot in that file."""
    shapes = state_shapes(config)
    entries: dict[str, object] = {"__metadata__": {METADATA_KEY: str(step)}}
    at = 0
    for name in sorted(shapes):
        nbytes = 4 * math.prod(shapes[name])
        entries[name] = {"dtype": "F32", "shape": list(shapes[name]), "data_offsets": [at, at + nbytes]}
        at += nbytes
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    header = struct.pack("<Q", len(text)) + text
    return header, _slots(entries, len(header))


def _slots(entries: dict, data_start: int) -> dict[str, Slot]:
    return {name: Slot(tuple(e["shape"]), data_start + e["data_offsets"][0], e["data_offsets"][1] - e["data_offsets"][0])
            for name, e in entries.items() if name != "__metadata__"}  # fmt: skip


def parse_header(header: bytes, size: int, config: GPTConfig, step: int) -> dict[str, Slot]:
    """The tensors' slots of a ``size``-byte checkpoint whose first bytes are ``header`` (length
    and JSON). Raises :class:`RunFormatError` unless it is a safetensors header
    (:func:`.safetensors_header.parse`: bounded, the data ranges tiling the data section) of
    exactly ``config``'s state at ``step``: the names, float32, the shapes, the step metadata."""
    try:
        entries, metadata = safetensors_header.parse(header, size, HEADER_SLACK)
    except safetensors_header.HeaderError as exc:
        raise RunFormatError(f"checkpoint {step}: {exc}") from None
    if metadata != {METADATA_KEY: str(step)}:
        raise RunFormatError(f"checkpoint {step}: the header's metadata is not that of checkpoint {step}")
    shapes = state_shapes(config)
    if {e.name for e in entries} != set(shapes):
        raise RunFormatError(f"checkpoint {step}: its tensors are not the names of the run's model")
    for e in entries:
        if e.dtype != "float32" or e.shape != shapes[e.name]:
            raise RunFormatError(f"checkpoint {step}: tensor {e.name}: not float32 {shapes[e.name]}")
    return {e.name: Slot(e.shape, e.offset, e.nbytes) for e in entries}


def _read_exactly(fd: int, view: memoryview, offset: int) -> None:
    while view.nbytes:
        n = os.preadv(fd, [view], offset)
        if n == 0:
            raise RunFormatError("checkpoint: the file ended early (it changed while being read)")
        view, offset = view[n:], offset + n


def _chunk_jobs(data: memoryview, first_chunk: int) -> list:
    """Start hashing ``data`` (whole chunks but perhaps the last) as chunks ``first_chunk``, … ."""
    pool = _chunk_pool()
    return [pool.submit(chunk_digest, first_chunk + i, data[at:at + CHUNK_SIZE])
            for i, at in enumerate(range(0, max(data.nbytes, 1), CHUNK_SIZE))]  # fmt: skip


def chunk_digests(array: np.ndarray) -> list[bytes]:
    """The state tree's chunk digests of a float32 array's raw bytes, hashed on every core."""
    return [job.result() for job in _chunk_jobs(_bytes_of(array), 0)]


def _bytes_of(array: np.ndarray) -> memoryview:
    return memoryview(np.ascontiguousarray(array, _F32).reshape(-1)).cast("B")


@dataclass(frozen=True)
class Scan:
    """What one pass over a checkpoint gave: its blob address, every tensor's chunk digests and
    slot, and the arrays of the tensors it was asked to keep (read-only)."""

    path: Path
    address: bytes
    slots: dict[str, Slot]
    digests: dict[str, list[bytes]]
    kept: dict[str, np.ndarray]

    def state_root(self) -> tuple[int, bytes]:
        return state_root_from(self.slots, self.digests)


def state_root_from(slots: Mapping[str, Slot], digests: Mapping[str, list[bytes]]) -> tuple[int, bytes]:
    """(count, state root) of a state from its tensors' chunk digests."""
    return state_root_of_digests({n: tensor_digest_of_chunks(n, "float32", slots[n].shape, digests[n]) for n in slots})


def _open(path: Path, config: GPTConfig, step: int) -> tuple[int, int]:
    try:
        return open_regular(path, max_checkpoint_bytes(config))
    except FileRefused as exc:
        raise RunFormatError(f"checkpoint {step}: {exc}") from None


def read_header(fd: int, size: int, step: int) -> bytearray:
    """The first bytes of checkpoint ``step`` open at ``fd`` (``size`` bytes): the 8-byte length
    and the JSON header, read only once the length is within :data:`HEADER_SLACK` and the file."""
    prefix = bytearray(_PREFIX)
    _read_exactly(fd, memoryview(prefix), 0)
    try:
        n = safetensors_header.header_length(prefix, HEADER_SLACK)
    except safetensors_header.HeaderError as exc:
        raise RunFormatError(f"checkpoint {step}: {exc}") from None
    if _PREFIX + n > size:
        raise RunFormatError(f"checkpoint {step}: a header of {n} bytes in a file of {size}")
    header = bytearray(_PREFIX + n)
    _read_exactly(fd, memoryview(header), 0)
    return header


def scan_checkpoint(path: Path, config: GPTConfig, step: int, address: bytes | None = None, *,
                    keep: str | None = "param/") -> Scan:
    """Read checkpoint ``step`` of ``config``'s model at ``path`` once, in file order, and keep the
    tensors whose names start with ``keep`` (None: none). Refused when the file is larger than the model allows
    (before it is read), when ``address`` is given and the file's BLAKE2b-256 is not it
    (:class:`CheckpointMismatchError`, which takes precedence), or when its header is not that
    model's (:func:`parse_header`)."""
    path = Path(path)
    fd, size = _open(path, config, step)
    try:
        header = read_header(fd, size, step)
        try:
            slots = parse_header(bytes(header), size, config, step)
        except RunFormatError:
            if address is not None and _file_address(fd, size) != address:
                raise CheckpointMismatchError(f"checkpoint {step}: the file is not the one the manifest names") from None
            raise
        hashed = hashlib.blake2b(header, digest_size=DIGEST_SIZE)
        scratch = memoryview(bytearray(PIECE_BYTES))
        digests: dict[str, list[bytes]] = {}
        kept: dict[str, np.ndarray] = {}
        for name, slot in sorted(slots.items(), key=lambda item: item[1].offset):
            target = None
            if keep is not None and name.startswith(keep):
                kept[name] = np.empty(slot.shape, _F32)
                target = memoryview(kept[name].reshape(-1)).cast("B")
            jobs = []
            for at in range(0, max(slot.nbytes, 1), PIECE_BYTES):
                length = min(PIECE_BYTES, slot.nbytes - at)
                piece = target[at:at + length] if target is not None else scratch[:length]
                _read_exactly(fd, piece, slot.offset + at)
                pending = _chunk_jobs(piece, at // CHUNK_SIZE)
                hashed.update(piece)  # the file's hash in this thread while the pool hashes chunks
                jobs += [job.result() for job in pending]  # the scratch piece is reused next
            digests[name] = jobs
            if name in kept:
                kept[name].flags.writeable = False
        if os.pread(fd, 1, size):
            raise RunFormatError(f"checkpoint {step}: the file grew while being read")
        if address is not None and hashed.digest() != address:
            raise CheckpointMismatchError(f"checkpoint {step}: the file is not the one the manifest names")
        return Scan(path, hashed.digest(), slots, digests, kept)
    finally:
        os.close(fd)


def _file_address(fd: int, size: int) -> bytes:
    hashed = hashlib.blake2b(digest_size=DIGEST_SIZE)
    piece = memoryview(bytearray(PIECE_BYTES))
    for at in range(0, size, PIECE_BYTES):
        view = piece[:min(PIECE_BYTES, size - at)]
        _read_exactly(fd, view, at)
        hashed.update(view)
    return hashed.digest()


def read_checked(path: Path, slot: Slot, digests: list[bytes], name: str) -> np.ndarray:
    """Tensor ``name`` from its ``slot`` of the file at ``path``, each chunk checked against
    ``digests`` (from the scan that checked the state hash): a read-only float32 array."""
    out = np.empty(slot.shape, _F32)
    view = memoryview(out.reshape(-1)).cast("B")
    try:
        fd, _ = open_regular(path, 1 << 62)  # its size was bounded by the scan; the chunks are checked here
    except FileRefused as exc:
        raise RunFormatError(f"{name}: {exc}") from None
    try:
        for at in range(0, slot.nbytes, PIECE_BYTES):
            piece = view[at:at + PIECE_BYTES]
            _read_exactly(fd, piece, slot.offset + at)
            got = [job.result() for job in _chunk_jobs(piece, at // CHUNK_SIZE)]
            if got != digests[at // CHUNK_SIZE:at // CHUNK_SIZE + len(got)]:
                raise CheckpointMismatchError(f"{path}: {name} is no longer the tensor whose hash was checked")
    finally:
        os.close(fd)
    out.flags.writeable = False
    return out


class FileMoments(Mapping):
    """One moment group (``adam_m`` or ``adam_v``) of a checkpoint as a read-only mapping from
    parameter name to array, each read from the file when asked for (:func:`read_checked`) and
    not kept: a :class:`.state.TrainState` whose moments are these holds only its parameters."""

    def __init__(self, path: Path, prefix: str, slots: Mapping[str, Slot], digests: Mapping[str, list[bytes]],
                 names: list[str]) -> None:
        self.path, self.prefix, self.slots, self.digests, self.names = Path(path), prefix, slots, digests, names

    def __getitem__(self, name: str) -> np.ndarray:
        key = f"{self.prefix}/{name}"
        if name not in self.names:
            raise KeyError(name)
        return read_checked(self.path, self.slots[key], self.digests[key], key)

    def __iter__(self):
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    def __reduce__(self):  # pickles as the plain dict it stands for
        return dict, (dict(self.items()),)


class HeldChunks:
    """One group (``param``, ``adam_m`` or ``adam_v``) of a checkpoint held in part: a file of the
    checkpoint's layout with holes where its chunks were not fetched. :meth:`elements` reads a
    range of a tensor and checks every chunk it lies in against ``digests`` (a chunk table that
    proved h_k), so a hole, or a byte changed since the fetch, is refused, never used."""

    def __init__(self, path: Path, prefix: str, slots: Mapping[str, Slot], digests: Mapping[str, list[bytes]]) -> None:
        self.path, self.prefix, self.slots, self.digests = Path(path), prefix, slots, digests

    def elements(self, name: str, part: slice) -> np.ndarray:
        """Elements ``part.start`` to ``part.stop`` of tensor ``name`` of this group, read-only."""
        key = f"{self.prefix}/{name}"
        slot = self.slots[key]
        begin, end = 4 * part.start, 4 * part.stop
        if not 0 <= begin < end <= slot.nbytes:
            raise ValueError(f"{key}: elements {part.start}:{part.stop} outside the tensor")
        first, last = begin // CHUNK_SIZE, (end - 1) // CHUNK_SIZE
        lo, hi = first * CHUNK_SIZE, min((last + 1) * CHUNK_SIZE, slot.nbytes)
        data = bytearray(hi - lo)
        try:
            fd, _ = open_regular(self.path, 1 << 62)  # opened by open_part, which bounded its size
        except FileRefused as exc:
            raise RunFormatError(f"{key}: {exc}") from None
        try:
            _read_exactly(fd, memoryview(data), slot.offset + lo)
        finally:
            os.close(fd)
        for i in range(first, last + 1):
            if chunk_digest(i, data[i * CHUNK_SIZE - lo:(i + 1) * CHUNK_SIZE - lo]) != self.digests[key][i]:
                raise CheckpointMismatchError(f"{self.path}: chunk {i} of {key} is not held, or not the proven one")
        return np.frombuffer(bytes(data[begin - lo:end - lo]), _F32)


class CheckpointWriter:
    """Checkpoint ``step`` of ``config``'s model written tensor by tensor, in any order, each into
    its place in the file (``path`` + ``.tmp`` until :meth:`finish`)."""

    def __init__(self, path: Path, config: GPTConfig, step: int) -> None:
        self.path = Path(path)
        self.tmp = self.path.with_name(self.path.name + ".tmp")
        header, self.slots = canonical_header(config, step)
        self.size = len(header) + sum(s.nbytes for s in self.slots.values())
        self.written: set[str] = set()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        self._write(memoryview(header), 0)
        os.ftruncate(self.fd, self.size)

    def _write(self, view: memoryview, offset: int) -> None:
        while view.nbytes:
            n = os.pwrite(self.fd, view[:PIECE_BYTES], offset)
            view, offset = view[n:], offset + n

    def write(self, name: str, array: np.ndarray) -> None:
        slot = self.slots[name]
        if tuple(array.shape) != slot.shape or name in self.written:
            raise ValueError(f"{name}: shape {array.shape} (expected {slot.shape}), or written twice")
        self._write(_bytes_of(array), slot.offset)
        self.written.add(name)

    def finish(self) -> bytes:
        """Close the file under its name and return its blob address (the file is read back in
        pieces to hash it: its tensors came in another order than the file's)."""
        if self.written != set(self.slots):
            raise ValueError(f"checkpoint not finished: {sorted(set(self.slots) - self.written)[:3]} … missing")
        try:
            os.fsync(self.fd)
            address = _file_address(self.fd, self.size)
        finally:
            os.close(self.fd)
        os.replace(self.tmp, self.path)
        return address

    def abort(self) -> None:
        os.close(self.fd)
        self.tmp.unlink(missing_ok=True)


class StateSink:
    """A state taken a tensor at a time (:meth:`add`): each tensor's chunk digests are computed on
    every core as it comes, then it is written to ``writer`` (if any) and let go. :meth:`root`
    gives the state root once every tensor of ``config``'s state has come."""

    def __init__(self, config: GPTConfig, writer: CheckpointWriter | None = None) -> None:
        self.shapes = state_shapes(config)
        self.slots = {n: Slot(s, 0, 4 * math.prod(s)) for n, s in self.shapes.items()}
        self.writer = writer
        self.digests: dict[str, list[bytes]] = {}

    def add(self, name: str, array: np.ndarray, digests: list[bytes] | None = None) -> None:
        """``digests``: the tensor's chunk digests where the caller hashed them already (a traced
        update, r20), else they are computed here."""
        if name in self.digests or tuple(array.shape) != self.shapes.get(name) or array.dtype != _F32:
            raise ValueError(f"{name}: not a float32 {self.shapes.get(name)} tensor of the state, or added twice")
        self.digests[name] = chunk_digests(array) if digests is None else digests
        if self.writer is not None:
            self.writer.write(name, array)

    def root(self) -> tuple[int, bytes]:
        if set(self.digests) != set(self.shapes):
            raise ValueError("the state is not complete")
        return state_root_from(self.slots, self.digests)


def file_state(config: GPTConfig, step: int, path: Path, slots: Mapping[str, Slot], digests: Mapping[str, list[bytes]],
               params: Mapping[str, np.ndarray]) -> TrainState:
    """State ``step`` with ``params`` (in memory, or a :class:`FileMoments` of ``param`` where only
    parts are read) and its moments and powers in the checkpoint at ``path`` (read back and checked
    against ``digests`` when used: :class:`FileMoments`)."""
    names = list(config.param_shapes())
    beta1_pow, beta2_pow = (read_checked(path, slots[n], digests[n], n)[0] for n in ("adam/beta1_pow", "adam/beta2_pow"))
    return TrainState(config, params, FileMoments(path, "adam_m", slots, digests, names),
                      FileMoments(path, "adam_v", slots, digests, names), step, np.float32(beta1_pow),
                      np.float32(beta2_pow))  # fmt: skip


def scanned_state(scan: Scan, config: GPTConfig, step: int) -> TrainState:
    """The state of a checkpoint :func:`scan_checkpoint` read (keeping ``param/``), for a step:
    its parameters in memory, its moments read back from the file when the update needs them.
    The parameters move out of ``scan.kept``: a streamed update replaces each one in the state,
    and a second holder would keep every old one alive (a third copy of the parameters)."""
    params = {name: scan.kept.pop(f"param/{name}") for name in config.param_shapes()}
    return file_state(config, step, scan.path, scan.slots, scan.digests, params)


def add_params_and_powers(sink: StateSink, params: Mapping[str, np.ndarray], beta1_pow: np.float32,
                          beta2_pow: np.float32) -> None:
    """Hand the rest of a new state to ``sink`` once its moments have come: every parameter, then the two powers."""
    for name, array in params.items():
        sink.add(f"param/{name}", array)
    sink.add("adam/beta1_pow", np.array([beta1_pow], _F32))
    sink.add("adam/beta2_pow", np.array([beta2_pow], _F32))
