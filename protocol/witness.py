"""Proof of replay: binding an attestation to a replay witness only a replay yields.

A step's replay witness W_k is 32 bytes that the engine computes from the step's loss and
pre-clip gradients (docs/run-format.md §5). The trainer commits to it in the manifest as

    C_k = B2("open1b/witness-commit/v1\\0" ‖ W_k)

and an attestation carries, for the W'_k its signer computed,

    witness = B2("open1b/witness-binding/v1\\0" ‖ run ‖ u64le(step) ‖ signer key ‖ W'_k)

The binding includes the signer's key, so copying another auditor's attestation field proves
nothing; and it hides W'_k, so reading attestations does not reveal the witness either.
A :class:`WitnessReveal` publishes W_k once someone must be checked against it (run-format §5).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import ClassVar, Mapping

from .hashing import blake2b256
from .identity import PUBLIC_KEY_SIZE
from .messages import HASH_SIZE, SignedMessage
from .schema import Bytes, FieldType, UInt

_COMMIT_TAG = b"open1b/witness-commit/v1\x00"
_BINDING_TAG = b"open1b/witness-binding/v1\x00"


def witness_commitment(witness: bytes) -> bytes:
    """C_k, the trainer's commitment to step k's witness in the manifest."""
    return blake2b256(_COMMIT_TAG, witness)


def witness_binding(run: bytes, step: int, signer: bytes, witness: bytes) -> bytes:
    """The ``witness`` field of ``signer``'s attestation of ``step`` of ``run``."""
    return blake2b256(_BINDING_TAG, run, struct.pack("<Q", step), signer, witness)


MAX_REVEAL_SIZE = 512


@dataclass(frozen=True)
class WitnessReveal(SignedMessage):
    """"Step ``step`` of ``run`` has the replay witness ``witness``." Valid only when ``witness``
    opens the manifest's C_step (docs/protocol.md §7): then any node can check every attestation's
    binding of that step without replaying it (§8.3 step 4)."""

    KIND: ClassVar[str] = "reveal"
    MAX_SIZE: ClassVar[int] = MAX_REVEAL_SIZE
    SIGNER: ClassVar[str] = "revealer"
    SCHEMA: ClassVar[Mapping[str, FieldType]] = {
        "run": Bytes(size=HASH_SIZE),
        "step": UInt(),
        "witness": Bytes(size=HASH_SIZE),
        "revealer": Bytes(size=PUBLIC_KEY_SIZE),
        "issued_at": UInt(),
    }

    run: bytes
    step: int
    witness: bytes
    revealer: bytes
    issued_at: int
