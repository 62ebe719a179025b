"""Proof of replay: binding an attestation to a replay witness only a replay yields.

A step's replay witness W_k is 32 bytes computed from the step's float32 loss and pre-clip
gradients (docs/run-format.md §5.1) by the rule the run names in its ``data`` map (key
``witness``; a run without the key uses v1):

    v1  W_k = B2("open1b/witness/v1\0" ‖ f32le(loss) ‖ for each parameter n in canonical order:
                 u16le(len(n)) ‖ n ‖ raw bytes of grad_n)
    v2  W_k = B2("open1b/witness/v2\0" ‖ f32le(loss) ‖ u32le(|G|) ‖ state_root(G)),
            G = {n: grad_n for every parameter n}, state_root as run-format §3 (chunks of 1 MiB)

v1 is one sequential hash; v2 is the state hash's chunk tree, so every chunk of every gradient
is an independent job, on any number of threads, with the same digest. The trainer commits to it in the manifest as

    C_k = B2("open1b/witness-commit/v1\\0" ‖ W_k)

and an attestation carries, for the W'_k its signer computed,

    witness = B2("open1b/witness-binding/v1\\0" ‖ run ‖ u64le(step) ‖ signer key ‖ W'_k)

The binding includes the signer's key, so copying another auditor's attestation field proves
nothing; and it hides W'_k, so reading attestations does not reveal the witness either.
A :class:`WitnessReveal` publishes W_k once someone must be checked against it (run-format §5).
"""

from __future__ import annotations

import struct
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import ClassVar, Iterable, Mapping

from .commitments import TensorBytes, state_root
from .hashing import blake2b256, hasher
from .identity import PUBLIC_KEY_SIZE
from .messages import HASH_SIZE, SignedMessage
from .schema import Bytes, FieldType, UInt

_COMMIT_TAG = b"open1b/witness-commit/v1\x00"
_BINDING_TAG = b"open1b/witness-binding/v1\x00"

WITNESS_KEY = "witness"
"""The manifest ``data`` key naming a run's witness rule (absent: :data:`WITNESS_SEQUENTIAL`)."""
WITNESS_SEQUENTIAL = "open1b/witness/v1"
WITNESS_TREE = "open1b/witness/v2"
WITNESS_RULES = (WITNESS_SEQUENTIAL, WITNESS_TREE)


def witness_rule(data: Mapping) -> str | None:
    """The witness rule a manifest's ``data`` map names, or None when it names one this code does
    not know (a replayer then cannot compute the run's witnesses and must not attest)."""
    rule = data.get(WITNESS_KEY, WITNESS_SEQUENTIAL)
    return rule if rule in WITNESS_RULES else None


def sequential_witness(loss_bits: int, grads: Iterable[tuple[str, bytes | memoryview]]) -> bytes:
    """W_k by rule v1: ``grads`` are (name, raw f32le bytes) in the canonical parameter order."""
    h = hasher()
    h.update(_WITNESS_TAGS[WITNESS_SEQUENTIAL] + struct.pack("<I", loss_bits))
    for name, raw in grads:
        encoded = name.encode()
        h.update(struct.pack("<H", len(encoded)) + encoded)
        h.update(raw)
    return h.digest()


def tree_witness(loss_bits: int, grads: Mapping[str, TensorBytes], *, workers: int | Executor | None = None) -> bytes:
    """W_k by rule v2: ``grads`` maps every parameter's name to its float32 gradient. Chunks are
    hashed as :func:`.commitments.state_root` hashes them (``workers`` threads, or that executor);
    the digest does not depend on ``workers``."""
    count, root = state_root(grads, workers=workers)
    return blake2b256(_WITNESS_TAGS[WITNESS_TREE], struct.pack("<II", loss_bits, count), root)


_WITNESS_TAGS = {rule: rule.encode() + b"\x00" for rule in WITNESS_RULES}


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
