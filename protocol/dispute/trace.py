"""The op trace of a step and its signed commitment (docs/protocol.md §18.1, run-format §11).

A step is a fixed sequence of ops; op ``pos`` (0-based, in the step's specified order) is
committed by its *record*, a canonical CBOR map::

    {"pos": pos, "kind": text, "attrs": {name: uint}, "inputs": [input…], "outputs": [tensor…]}
    tensor = {"dtype": text, "shape": [uint…], "root": 32 bytes}
    input  = tensor plus {"op": j, "out": o}   (output o of the earlier op j of the same trace)
          or tensor plus {"state": name}       (tensor ``name`` of the state h_k the step starts from)

An op output's ``root`` is the Merkle root (§6.2) over its raw bytes cut into
:data:`TRACE_CHUNK_SIZE` chunks, chunk i's digest ``BLAKE3-derive_key(TRACE_CHUNK_CONTEXT, chunk ‖
u64le(i))`` (BLAKE3: a trace hashes every op output of a step, §18.6). A state input's root is the
state tree's tensor root (1 MiB BLAKE2b chunks), so it is proven against h_k as it is; so is an
output of a kind in :data:`STATE_OUTPUT_KINDS` (the update's p, m and v are tensors of h_{k+1}: a
replay hashes them for h_{k+1} anyway, and the trace reuses those roots, r20).

    leaf(pos)   = B2("open1b/trace/op/v1\\0" ‖ canonical(record))
    trace root  = MTH([leaf(0), …, leaf(ops - 1)])

The commitment a party signs is :class:`TraceCommitment`. No numpy; BLAKE3 is the referee extra's.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping, Protocol, Sequence

from ..codec import encode
from ..commitments import CHUNK_SIZE, ITEMSIZE
from ..hashing import blake2b256
from ..merkle import MerkleTree
from ..messages import HASH_SIZE, SignedMessage
from ..schema import Bytes, FieldType, UInt

TRACE_CHUNK_SIZE = 1 << 16
"""Bytes per chunk of an op output (64 KiB; the last may be shorter): a proof carries whole
chunks; at 16 KiB a call and a tree node per chunk cost as much as the bytes."""
STATE_CHUNK_SIZE = CHUNK_SIZE
MAX_TRACE_OPS = 1 << 24
"""More ops than any preset's step has (gpt-1b: ~10⁴ per micro-batch)."""
MAX_TRACE_SIZE = 512
TRACE_CHUNK_CONTEXT = "open1b/trace/chunk/v2"
"""BLAKE3's key-derivation context of a trace chunk's digest: its domain separation."""
STATE_OUTPUT_KINDS = frozenset({"adamw"})
"""Op kinds whose outputs are tensors of h_{k+1}: their roots are the state tree's (§18.1)."""
_STATE_CHUNK_TAG = b"open1b/chunk/v2\x00"  # the state tree's (protocol.commitments)
OP_TAG = b"open1b/trace/op/v1\x00"


def chunk_digest(index: int, chunk: bytes | memoryview, *, state: bool) -> bytes:
    """The digest of chunk ``index``: the state tree's when ``state``, else the trace's."""
    if state:
        return blake2b256(_STATE_CHUNK_TAG, struct.pack("<Q", index), chunk)
    import blake3  # the referee extra's: the base install decodes proofs and coverage without it

    h = blake3.blake3(chunk, derive_key_context=TRACE_CHUNK_CONTEXT)
    h.update(struct.pack("<Q", index))
    return h.digest()


def state_output(kind: str) -> bool:
    """Whether op ``kind``'s outputs are chunked and hashed as the state's (:data:`STATE_OUTPUT_KINDS`)."""
    return kind in STATE_OUTPUT_KINDS


def chunk_size(*, state: bool) -> int:
    return STATE_CHUNK_SIZE if state else TRACE_CHUNK_SIZE


def chunk_count(nbytes: int, *, state: bool) -> int:
    return max(1, -(-nbytes // chunk_size(state=state)))


class Pieces(Protocol):
    """A tensor's raw bytes read in pieces, never whole (a node keeps a dispute's op data on disk)."""

    nbytes: int

    def read(self, offset: int, size: int) -> bytes: ...


def chunk_reader(data: bytes | memoryview | Pieces) -> tuple[int, Callable[[int, int], bytes | memoryview]]:
    """``data``'s size and a reader of ``(offset, size)`` pieces of it, without a copy of a buffer."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        raw = memoryview(data).cast("B")
        return raw.nbytes, lambda offset, size: raw[offset:offset + size]
    return data.nbytes, data.read


def chunk_tree(data: bytes | memoryview | Pieces, *, state: bool = False) -> MerkleTree:
    """The Merkle tree over the chunk digests of a tensor's raw bytes."""
    size, (n, read) = chunk_size(state=state), chunk_reader(data)
    return MerkleTree([chunk_digest(i, read(i * size, size), state=state) for i in range(chunk_count(n, state=state))])


def nbytes(dtype: str, shape: Sequence[int]) -> int:
    n = ITEMSIZE[dtype]
    for d in shape:
        n *= d
    return n


def tensor(dtype: str, shape: Sequence[int], data: bytes | memoryview, *, state: bool = False) -> dict:
    """The record entry of a tensor: dtype, shape and chunk-tree root."""
    if len(memoryview(data).cast("B")) != nbytes(dtype, shape):
        raise ValueError(f"{len(data)} bytes for a {dtype} tensor of shape {tuple(shape)}")
    return {"dtype": dtype, "shape": list(shape), "root": chunk_tree(data, state=state).root}


def op_leaf(record: Mapping[str, Any]) -> bytes:
    """The trace's leaf value of an op record."""
    return blake2b256(OP_TAG, encode(dict(record)))


def trace_tree(records: Sequence[Mapping[str, Any]]) -> MerkleTree:
    """The trace tree of a step's op records, in position order."""
    if [r["pos"] for r in records] != list(range(len(records))):
        raise ValueError("op records must be given in position order, from 0")
    return MerkleTree([op_leaf(r) for r in records])


_HASH = Bytes(size=HASH_SIZE)


@dataclass(frozen=True)
class TraceCommitment(SignedMessage):
    """A party's signed commitment to its op trace of step ``step`` of run ``run``: the trace
    ``root`` over ``ops`` op records, computed from the state ``pre_state`` (h_step), reaching
    ``post_state`` (its h_{step+1}). Two commitments to the same step that differ are what a
    bisection starts from; a fraud proof carries both."""

    KIND: ClassVar[str] = "trace"
    MAX_SIZE: ClassVar[int] = MAX_TRACE_SIZE
    SIGNER: ClassVar[str] = "tracer"
    SCHEMA: ClassVar[Mapping[str, FieldType]] = {
        "run": _HASH, "step": UInt(), "pre_state": _HASH, "post_state": _HASH, "ops": UInt(maximum=MAX_TRACE_OPS),
        "root": _HASH, "tracer": Bytes(size=32),
    }  # fmt: skip

    run: bytes
    step: int
    pre_state: bytes
    post_state: bytes
    ops: int
    root: bytes
    tracer: bytes
