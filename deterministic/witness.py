"""The replay witness of a step: evidence that only running the step's forward and backward yields.

    W_k = B2("open1b/witness/v1\\0" ‖ f32le(loss) ‖ for each parameter n in canonical order:
              u16le(len(n)) ‖ n ‖ raw little-endian bytes of the summed, pre-clip gradient of n)

The post-step state is public (its hash is in the manifest and its checkpoint is fetchable), so
an auditor could claim "match" by echoing it. The pre-clip gradient is not recoverable from the
states before and after the step: AdamW folds it into rounded moments, so many gradients map to
the same moments, and the loss is never stored at all. An attestation therefore binds W_k to
its signer's key (docs/run-format.md §5) and the trainer commits to W_k in the manifest.
"""

from __future__ import annotations

import hashlib
import struct
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from .process_pool import PerProcessPool

WITNESS_TAG = b"open1b/witness/v1\x00"


def replay_witness(loss: np.float32, grads: Mapping[str, np.ndarray], order: list[str]) -> bytes:
    """W_k for a step's float32 mean ``loss`` and summed pre-clip ``grads`` (names in ``order``)."""
    h = hashlib.blake2b(digest_size=32)
    h.update(WITNESS_TAG + np.float32(loss).astype("<f4").tobytes())
    for name in order:
        encoded = name.encode()
        h.update(struct.pack("<H", len(encoded)) + encoded)
        h.update(np.ascontiguousarray(grads[name], dtype="<f4").tobytes())
    return h.digest()


@dataclass(frozen=True)
class StepScalars:
    """A step's host-side results: its mean loss, gradient norm and clipping coefficient, and
    its witness W_k as it is being hashed (``witness.result()`` waits for the digest)."""

    loss: np.float32
    grad_norm: np.float32
    clip_coef: np.float32
    witness: Future


_hasher = PerProcessPool(1, "open1b-witness")  # one thread: W_k is one sequential hash


def witness_async(loss: np.float32, grads: Mapping[str, np.ndarray], order: list[str], grad_norm: np.float32,
                  clip_coef: np.float32) -> StepScalars:
    """:func:`replay_witness` hashed on a background thread (hashlib releases the GIL on large
    buffers, so it overlaps the step's remaining kernels). ``grads`` must not change until
    ``witness`` is done."""
    return StepScalars(loss, grad_norm, clip_coef, _hasher().submit(replay_witness, loss, grads, order))
