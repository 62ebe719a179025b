"""State and data commitments: how a training state becomes the 32-byte h_k of a run.

    tensor_digest(name, t) = B2("open1b/tensor/v1\\0" ‖ name ‖ 0x00 ‖ dtype ‖ 0x00
                                ‖ u8(ndim) ‖ u64le(dim)… ‖ raw little-endian C-order bytes)
    state_hash(prev, k, T, bd) = B2("open1b/state/v1\\0" ‖ prev ‖ u64le(k) ‖ bd ‖ u32le(|T|)
                                ‖ for name in sorted(T): u16le(len(name)) ‖ name ‖ tensor_digest)
    h_0     = state_hash(genesis(run parameters), 0, state_0, ZERO_HASH)
    h_{k+1} = state_hash(h_k, k + 1, state_{k+1}, batch_digest(batches consumed by step k))

Chaining ``prev`` makes every h_k commit to the whole history; the per-tensor digests let a
single tensor be checked without rehashing the others. This module works on bytes and shapes
only, so a verifier needs no numpy to use it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .codec import encode
from .hashing import DIGEST_SIZE, blake2b256, hasher

ZERO_HASH = bytes(DIGEST_SIZE)
_TENSOR_TAG = b"open1b/tensor/v1\x00"
_STATE_TAG = b"open1b/state/v1\x00"
_GENESIS_TAG = b"open1b/genesis/v1\x00"
_BATCH_TAG = b"open1b/batch/v1\x00"

DTYPES = frozenset({"float32", "int32", "int64", "uint8"})


@dataclass(frozen=True)
class TensorBytes:
    """A tensor as the protocol sees it: a dtype name, a shape and raw little-endian C-order bytes."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes | memoryview


def tensor_digest(name: str, tensor: TensorBytes) -> bytes:
    if tensor.dtype not in DTYPES:
        raise ValueError(f"unsupported dtype {tensor.dtype!r}")
    h = hasher()
    h.update(_TENSOR_TAG + name.encode() + b"\x00" + tensor.dtype.encode() + b"\x00")
    h.update(struct.pack("<B", len(tensor.shape)) + b"".join(struct.pack("<Q", d) for d in tensor.shape))
    h.update(tensor.data)
    return h.digest()


def state_hash(prev: bytes, step: int, tensors: Mapping[str, TensorBytes], batch_digest: bytes) -> bytes:
    h = hasher()
    h.update(_STATE_TAG + prev + struct.pack("<Q", step) + batch_digest + struct.pack("<I", len(tensors)))
    for name in sorted(tensors):
        encoded = name.encode()
        h.update(struct.pack("<H", len(encoded)) + encoded + tensor_digest(name, tensors[name]))
    return h.digest()


def genesis(parameters: Mapping[str, Any]) -> bytes:
    """The ``prev`` of h_0: binds the run's engine, model config, data and seed into the chain."""
    return blake2b256(_GENESIS_TAG, encode(dict(parameters)))


def batch_digest(rank_batches: Sequence[TensorBytes]) -> bytes:
    """Digest of exactly the token batches a step consumed, one per data-parallel rank, in rank order."""
    h = hasher()
    h.update(_BATCH_TAG + struct.pack("<I", len(rank_batches)))
    for rank, batch in enumerate(rank_batches):
        h.update(tensor_digest(f"rank/{rank}", batch))
    return h.digest()
