"""What h_k chains besides the state (docs/run-format.md §3): the genesis, h_0's ``prev``, and the
digest of the batch the step consumed."""

from __future__ import annotations

import struct
from typing import Any, Mapping, Sequence

from .codec import encode
from .commitments import TensorBytes, tensor_digest
from .hashing import blake2b256, hasher

_GENESIS_TAG = b"open1b/genesis/v1\x00"  # its bytes did not change in format 2
_BATCH_TAG = b"open1b/batch/v2\x00"  # v2: it is built from v2 tensor digests


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
