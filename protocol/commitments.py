"""State and data commitments: how a training state becomes the 32-byte h_k of a run (run format 2,
docs/run-format.md §3).

    chunk_digest(i, c)  = B2("open1b/chunk/v2\\0" ‖ u64le(i) ‖ c)       c: chunk i, CHUNK_SIZE bytes or fewer
    tensor_root(t)      = MTH([chunk_digest(i, c_i) for each chunk i of t's raw bytes])
    tensor_digest(n, t) = B2("open1b/tensor/v2\\0" ‖ u16le(len(n)) ‖ n ‖ u8(len(dtype)) ‖ dtype
                             ‖ u8(ndim) ‖ u64le(dim)… ‖ u64le(len(raw)) ‖ tensor_root(t))
    state_root(T)       = MTH([tensor_digest(n, T[n]) for n in T, sorted by UTF-8 bytes])
    state_hash(prev, k, T, bd, lr_bits) = B2("open1b/state/v2\\0" ‖ prev ‖ u64le(k) ‖ u32le(lr_bits)
                             ‖ bd ‖ u32le(|T|) ‖ state_root(T))
    h_0     = state_hash(genesis(run parameters), 0, state_0, ZERO_HASH, lr_bits=0)
    h_{k+1} = state_hash(h_k, k + 1, state_{k+1}, batch_digest(batches of step k), lr_bits=f32 bits of step k's lr)

MTH is the Merkle tree of :mod:`.merkle`. Chunks make the hash parallel (every chunk of every
tensor is an independent job) and let one tensor, or one chunk, be proven against a published h
without the rest of the state. This module works on bytes and shapes only (no numpy).
"""

from __future__ import annotations

import os
import struct
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Mapping, Sequence

from .hashing import DIGEST_SIZE, blake2b256
from .merkle import merkle_proof, merkle_root, verify_merkle_proof

ZERO_HASH = bytes(DIGEST_SIZE)
CHUNK_SIZE = 1 << 20
"""Bytes per chunk of a tensor's raw data (1 MiB); the last chunk may be shorter."""
_CHUNK_TAG = b"open1b/chunk/v2\x00"
_TENSOR_TAG = b"open1b/tensor/v2\x00"
_STATE_TAG = b"open1b/state/v2\x00"

ITEMSIZE = {"float32": 4, "int32": 4, "int64": 8, "uint8": 1}
DTYPES = frozenset(ITEMSIZE)


@dataclass(frozen=True)
class TensorBytes:
    """A tensor as the protocol sees it: a dtype name, a shape and raw little-endian C-order bytes."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes | memoryview


def _nbytes(dtype: str, shape: Sequence[int]) -> int:
    """The byte length a tensor of ``dtype`` and ``shape`` has, after checking both."""
    if dtype not in DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}")
    if len(shape) > 255 or any(type(d) is not int or not 0 <= d < 1 << 64 for d in shape):
        raise ValueError(f"invalid shape {shape!r}")
    n = ITEMSIZE[dtype]
    for d in shape:
        n *= d
    return n


def _raw(tensor: TensorBytes) -> memoryview:
    """The tensor's bytes as a flat byte view, after checking that dtype and shape account for them."""
    raw = memoryview(tensor.data).cast("B")
    expected = _nbytes(tensor.dtype, tensor.shape)
    if raw.nbytes != expected:
        raise ValueError(f"{raw.nbytes} bytes for a {tensor.dtype} tensor of shape {tensor.shape}"
                         f" ({expected} expected)")
    return raw


def _chunk_count(nbytes: int) -> int:
    return max(1, -(-nbytes // CHUNK_SIZE))  # a zero-byte tensor has one empty chunk


def chunk_digest(index: int, chunk: bytes | memoryview) -> bytes:
    """``chunk_digest(i, c)`` of the module doc (public: a state is also hashed a chunk at a time as
    it is produced or read, with :func:`tensor_digest_of_chunks` and :func:`state_root_of_digests`)."""
    # hashlib's BLAKE2b releases the GIL while it hashes a buffer of 2 KiB or more (CPython's
    # HASHLIB_GIL_MINSIZE). Checked on the 2-core build machine (CPython 3.11.7): a pure-Python
    # counter thread kept its idle rate while another thread hashed 128 MiB, so threads give real
    # parallelism here, and bench/hash_bench.py measures how much.
    return blake2b256(_CHUNK_TAG, struct.pack("<Q", index), chunk)


def _digest(name: str, dtype: str, shape: Sequence[int], nbytes: int, root: bytes) -> bytes:
    encoded = name.encode()
    if len(encoded) >= 1 << 16:
        raise ValueError(f"tensor name of {len(encoded)} bytes (at most 65535)")
    return blake2b256(_TENSOR_TAG, struct.pack("<H", len(encoded)), encoded, struct.pack("<B", len(dtype)),
                      dtype.encode(), struct.pack("<B", len(shape)), struct.pack(f"<{len(shape)}Q", *shape),
                      struct.pack("<Q", nbytes), root)


def _all_chunk_digests(raws: Sequence[memoryview], workers: int | Executor | None) -> list[list[bytes]]:
    """Chunk digests of every tensor, computed by a pool of ``workers`` threads (default: one per
    core) or on the executor ``workers`` (a caller's long-lived pool). Each digest depends only on
    its chunk and index and lands in a fixed slot, so the result is the same for any number of workers."""
    jobs = [(t, i) for t, raw in enumerate(raws) for i in range(_chunk_count(raw.nbytes))]

    def job(ti: tuple[int, int]) -> bytes:
        t, i = ti
        return chunk_digest(i, raws[t][i * CHUNK_SIZE:(i + 1) * CHUNK_SIZE])

    if isinstance(workers, Executor):
        digests = list(workers.map(job, jobs))  # map keeps the jobs' order, whatever finishes first
    elif (workers := (os.cpu_count() or 1) if workers is None else workers) < 1:
        raise ValueError(f"workers must be at least 1, not {workers}")
    elif workers == 1 or len(jobs) == 1:
        digests = list(map(job, jobs))
    else:
        with ThreadPoolExecutor(min(workers, len(jobs))) as pool:
            digests = list(pool.map(job, jobs))
    out: list[list[bytes]] = [[] for _ in raws]
    for (t, _), d in zip(jobs, digests):
        out[t].append(d)
    return out


def tensor_digest(name: str, tensor: TensorBytes, *, workers: int | None = None) -> bytes:
    """The digest of one named tensor: its name, dtype, shape, byte length and chunk-tree root."""
    raw = _raw(tensor)
    return _digest(name, tensor.dtype, tensor.shape, raw.nbytes, merkle_root(_all_chunk_digests([raw], workers)[0]))


@dataclass(frozen=True)
class _Tree:
    names: list[str]  # sorted by UTF-8 bytes: the leaf order of the state tree
    chunks: list[list[bytes]]  # chunk digests per tensor, in that order
    digests: list[bytes]  # tensor digests, in that order


def _tree(tensors: Mapping[str, TensorBytes], workers: int | Executor | None) -> _Tree:
    if not tensors:
        raise ValueError("a state has at least one tensor")
    if len(tensors) >= 1 << 32:
        raise ValueError("too many tensors")
    names = sorted(tensors, key=lambda n: n.encode())
    raws = [_raw(tensors[n]) for n in names]
    chunks = _all_chunk_digests(raws, workers)
    digests = [_digest(n, tensors[n].dtype, tensors[n].shape, raw.nbytes, merkle_root(c))
               for n, raw, c in zip(names, raws, chunks)]
    return _Tree(names, chunks, digests)


def state_hash_of_root(prev: bytes, step: int, lr_bits: int, batch_digest: bytes, count: int, root: bytes) -> bytes:
    """h_k from ``prev`` and the rest of its preimage (:func:`state_root` gives count and root), every
    field fixed-width, so the 128-byte preimage is unambiguous."""
    if len(prev) != DIGEST_SIZE or len(batch_digest) != DIGEST_SIZE or len(root) != DIGEST_SIZE:
        raise ValueError("prev, batch digest and state root are 32-byte hashes")
    if not all(type(v) is int for v in (step, lr_bits, count)) or not (
            0 <= step < 1 << 64 and 0 <= lr_bits < 1 << 32 and 0 < count < 1 << 32):
        raise ValueError(f"step {step}, lr_bits {lr_bits} or tensor count {count} out of range")
    return blake2b256(_STATE_TAG, prev, struct.pack("<QI", step, lr_bits), batch_digest, struct.pack("<I", count), root)


def state_hash(prev: bytes, step: int, tensors: Mapping[str, TensorBytes], batch_digest: bytes, *,
               lr_bits: int, workers: int | None = None) -> bytes:
    """h_k of the state ``tensors`` reached at ``step``. ``lr_bits`` is the float32 bit pattern of
    the learning rate the step that produced the state used (0 for h_0). Chunks are hashed by
    ``workers`` threads (default: one per core); the hash does not depend on ``workers``."""
    return state_hash_of_root(prev, step, lr_bits, batch_digest, *state_root(tensors, workers=workers))


def state_root(tensors: Mapping[str, TensorBytes], *, workers: int | Executor | None = None) -> tuple[int, bytes]:
    """(tensor count, state root) of a state: the expensive part of h_k, which does not depend on
    ``prev`` (a trainer hashes each state as it goes and chains them once the genesis is known)."""
    tree = _tree(tensors, workers)
    return len(tree.digests), merkle_root(tree.digests)


def tensor_digest_of_chunks(name: str, dtype: str, shape: Sequence[int], chunk_digests: Sequence[bytes]) -> bytes:
    """``tensor_digest(n, t)`` from the chunk digests of t's raw bytes, in index order."""
    nbytes = _nbytes(dtype, shape)
    if len(chunk_digests) != _chunk_count(nbytes):
        raise ValueError(f"{len(chunk_digests)} chunk digests for a tensor of {nbytes} bytes")
    return _digest(name, dtype, shape, nbytes, merkle_root(list(chunk_digests)))


def state_root_of_digests(digests: Mapping[str, bytes]) -> tuple[int, bytes]:
    """(tensor count, state root) from every tensor's digest (:func:`tensor_digest_of_chunks`):
    what :func:`state_root` gives for the whole state."""
    if not digests or len(digests) >= 1 << 32:
        raise ValueError(f"a state has 1 to 2**32 - 1 tensors, not {len(digests)}")
    return len(digests), merkle_root([digests[n] for n in sorted(digests, key=lambda n: n.encode())])


@dataclass(frozen=True)
class TensorProof:
    """That one tensor is part of a published h: every other field of h's preimage, and the audit
    path of the tensor's digest (leaf ``index`` of ``count``) to ``state_root``."""

    prev: bytes
    step: int
    lr_bits: int
    batch_digest: bytes
    count: int
    state_root: bytes
    index: int
    path: tuple[bytes, ...]


@dataclass(frozen=True)
class ChunkProof:
    """That one chunk of one tensor is part of a published h, without the rest of the tensor: its
    dtype, shape and chunk-tree root, the chunk's audit path in that tree, and the tensor's proof."""

    dtype: str
    shape: tuple[int, ...]
    tensor_root: bytes
    path: tuple[bytes, ...]
    tensor: TensorProof


def tensor_proof(prev: bytes, step: int, tensors: Mapping[str, TensorBytes], batch_digest: bytes, name: str, *,
                 lr_bits: int, workers: int | None = None) -> TensorProof:
    """The proof that ``tensors[name]`` belongs to ``state_hash(prev, step, tensors, batch_digest, lr_bits=…)``."""
    return _proof(_tree(tensors, workers), prev, step, lr_bits, batch_digest, name)


def tensor_proof_of_digests(prev: bytes, step: int, digests: Mapping[str, bytes], batch_digest: bytes, name: str, *,
                            lr_bits: int) -> TensorProof:
    """:func:`tensor_proof` from every tensor's digest (:func:`tensor_digest_of_chunks`) instead of
    the tensors' bytes: what a replayer that hashed its checkpoint a chunk at a time holds."""
    names = sorted(digests, key=lambda n: n.encode())
    return _proof(_Tree(names, [], [digests[n] for n in names]), prev, step, lr_bits, batch_digest, name)


def _proof(tree: _Tree, prev: bytes, step: int, lr_bits: int, batch_digest: bytes, name: str) -> TensorProof:
    if name not in tree.names:
        raise KeyError(f"no tensor {name!r} in the state")
    i = tree.names.index(name)
    return TensorProof(bytes(prev), step, lr_bits, bytes(batch_digest), len(tree.digests), merkle_root(tree.digests),
                       i, tuple(merkle_proof(tree.digests, i)))


def _verify_digest(digest: bytes, proof: TensorProof, expected_hash: bytes) -> bool:
    try:  # a proof is untrusted input: a malformed one is a failed one
        h = state_hash_of_root(proof.prev, proof.step, proof.lr_bits, proof.batch_digest, proof.count, proof.state_root)
        return (h == expected_hash and type(proof.index) is int
                and verify_merkle_proof(digest, proof.index, proof.count, proof.path, proof.state_root))
    except (ValueError, TypeError):
        return False


def verify_tensor_root(name: str, dtype: str, shape: Sequence[int], tensor_root: bytes, proof: TensorProof,
                       expected_hash: bytes) -> bool:
    """True if the state hashed to ``expected_hash`` holds, under ``name``, a tensor of ``dtype`` and
    ``shape`` whose chunk tree has root ``tensor_root``: a tensor proven without its bytes, whose
    chunks are then opened against that root (a fraud proof's state inputs, docs/protocol.md §18.3)."""
    try:  # a proof is untrusted input: a malformed one is a failed one
        return _verify_digest(_digest(name, dtype, tuple(shape), _nbytes(dtype, tuple(shape)), tensor_root), proof,
                              expected_hash)
    except (ValueError, TypeError, struct.error):
        return False


def verify_tensor_proof(name: str, tensor: TensorBytes, proof: TensorProof, expected_hash: bytes) -> bool:
    """True if the state hashed to ``expected_hash`` holds ``tensor`` under ``name``. This shows
    membership only: that the state holds no other tensor of that name needs the whole state."""
    try:
        digest = tensor_digest(name, tensor)
    except (ValueError, TypeError):  # bytes that are not a valid tensor are in no state
        return False
    return _verify_digest(digest, proof, expected_hash)


def chunk_proof(prev: bytes, step: int, tensors: Mapping[str, TensorBytes], batch_digest: bytes, name: str,
                chunk: int, *, lr_bits: int, workers: int | None = None) -> ChunkProof:
    """The proof that chunk ``chunk`` of ``tensors[name]`` belongs to the state hash."""
    tree = _tree(tensors, workers)
    tp = _proof(tree, prev, step, lr_bits, batch_digest, name)
    t, chunks = tensors[name], tree.chunks[tp.index]
    return ChunkProof(t.dtype, tuple(t.shape), merkle_root(chunks), tuple(merkle_proof(chunks, chunk)), tp)


def verify_chunk_proof(name: str, chunk: int, data: bytes | memoryview, proof: ChunkProof,
                       expected_hash: bytes) -> bool:
    """True if ``data`` is chunk ``chunk`` of the tensor ``name`` of the state hashed to ``expected_hash``."""
    try:  # a proof is untrusted input: a malformed one is a failed one
        nbytes = _nbytes(proof.dtype, proof.shape)
        count, data = _chunk_count(nbytes), memoryview(data).cast("B")
        if type(chunk) is not int or not 0 <= chunk < count or \
                data.nbytes != min(CHUNK_SIZE, nbytes - chunk * CHUNK_SIZE):
            return False  # a chunk's length follows from its index: check it rather than leave it to the hash
        return (verify_merkle_proof(chunk_digest(chunk, data), chunk, count, proof.path, proof.tensor_root)
                and _verify_digest(_digest(name, proof.dtype, proof.shape, nbytes, proof.tensor_root), proof.tensor,
                                   expected_hash))
    except (ValueError, TypeError):
        return False
