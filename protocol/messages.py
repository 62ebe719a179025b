"""The signed statements of the protocol: RunManifest, Claim and Attestation.

Each message travels as one canonical CBOR map ``{"kind", "v", <fields>, "sig"}``. Its identity
is the BLAKE2b-256 of those bytes (:attr:`SignedMessage.digest`), so a store can hold statements
as an append-only set and two stores merge by union. ``decode`` checks size, canonical form,
schema and signature, in that order, and builds nothing until all of them pass.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar, Mapping, TypeVar

from . import signing
from .codec import decode, encode
from .errors import WrongTypeError
from .hashing import blake2b256
from .identity import PUBLIC_KEY_SIZE, SIGNATURE_SIZE, Identity, peer_id_from_public_key
from .schema import Bytes, Enum, FieldType, ListOf, Scalars, Text, UInt, check_map

PROTOCOL_VERSION = 1
HASH_SIZE = 32

MAX_MANIFEST_SIZE = 1 << 20
MAX_CLAIM_SIZE = 512
MAX_ATTESTATION_SIZE = 1024
# Manifests carry the state-hash chain inline; 35 bytes per step keeps a run of this many
# steps inside MAX_MANIFEST_SIZE. Longer runs need a trajectory blob (see docs/protocol.md).
MAX_INLINE_STEPS = 16384

MATCH = "match"
MISMATCH = "mismatch"

_HASH = Bytes(size=HASH_SIZE)
_KEY = Bytes(size=PUBLIC_KEY_SIZE)
_ENVELOPE: dict[str, FieldType] = {
    "kind": Text(max_length=32),
    "v": UInt(maximum=255),
    "sig": Bytes(size=SIGNATURE_SIZE),
}

M = TypeVar("M", bound="SignedMessage")


@dataclass(frozen=True)
class SignedMessage:
    """Base of every signed statement. Subclasses declare KIND, SCHEMA, MAX_SIZE and SIGNER."""

    KIND: ClassVar[str]
    SCHEMA: ClassVar[Mapping[str, FieldType]]
    MAX_SIZE: ClassVar[int]
    SIGNER: ClassVar[str]

    sig: bytes

    def body(self) -> dict[str, Any]:
        """The signed map: every field but ``sig``, plus kind and version."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "sig"}
        return {"kind": self.KIND, "v": PROTOCOL_VERSION, **fields}

    @cached_property
    def encoded(self) -> bytes:
        return encode({**self.body(), "sig": self.sig})

    @cached_property
    def digest(self) -> bytes:
        """The statement's identity: BLAKE2b-256 of its canonical bytes."""
        return blake2b256(self.encoded)

    @property
    def signer_key(self) -> bytes:
        return getattr(self, self.SIGNER)

    @property
    def signer_peer_id(self) -> str:
        return peer_id_from_public_key(self.signer_key)

    @classmethod
    def create(cls: type[M], identity: Identity, **fields: Any) -> M:
        """Build and sign a message; the signer field is filled from ``identity``."""
        fields[cls.SIGNER] = identity.public_key
        body = {"kind": cls.KIND, "v": PROTOCOL_VERSION, **fields}
        check_map({**_ENVELOPE, **cls.SCHEMA}, {**body, "sig": bytes(SIGNATURE_SIZE)}, cls.KIND)
        message = cls(sig=signing.sign(identity, cls.KIND, body), **fields)
        message._check_semantics()
        return message

    @classmethod
    def decode(cls: type[M], data: bytes) -> M:
        """Parse and authenticate ``data``; raises a typed ProtocolError on any defect."""
        value = decode(data, max_size=cls.MAX_SIZE)
        # kind and version first: a future version may change every other field
        kind = value.get("kind") if type(value) is dict else None
        if kind != cls.KIND:
            raise WrongTypeError(f"expected a {cls.KIND}, got {kind!r}", code="kind")
        if value.get("v") != PROTOCOL_VERSION or type(value.get("v")) is not int:
            raise WrongTypeError(f"{cls.KIND}: unsupported protocol version {value.get('v')!r}", code="version")
        check_map({**_ENVELOPE, **cls.SCHEMA}, value, cls.KIND)
        fields = {name: value[name] for name in cls.SCHEMA}
        message = cls(sig=value["sig"], **fields)
        message._check_semantics()
        signing.verify(fields[cls.SIGNER], cls.KIND, message.body(), value["sig"])
        return message

    def _check_semantics(self) -> None:
        """Cross-field rules a schema cannot express; subclasses extend."""


@dataclass(frozen=True)
class RunManifest(SignedMessage):
    """A trainer's signed description of a published run, with its state-hash chain.

    ``state_hashes[k]`` is h_k, the commitment to the state before step k; it has ``steps + 1``
    entries. The run is identified by :attr:`run_id`, the digest of the signed manifest.
    """

    KIND: ClassVar[str] = "manifest"
    MAX_SIZE: ClassVar[int] = MAX_MANIFEST_SIZE
    SIGNER: ClassVar[str] = "publisher"
    SCHEMA: ClassVar[Mapping[str, FieldType]] = {
        "engine": Text(max_length=64),
        "engine_version": Text(max_length=64),
        "model": Scalars(max_entries=64),
        "data": Scalars(max_entries=16),
        "seed": UInt(),
        "steps": UInt(maximum=MAX_INLINE_STEPS),
        "state_hashes": ListOf(_HASH, max_length=MAX_INLINE_STEPS + 1),
        "publisher": _KEY,
        "created_at": UInt(),
    }

    engine: str
    engine_version: str
    model: dict[str, Any]
    data: dict[str, Any]
    seed: int
    steps: int
    state_hashes: list[bytes]
    publisher: bytes
    created_at: int

    def _check_semantics(self) -> None:
        if self.steps < 1 or len(self.state_hashes) != self.steps + 1:
            raise WrongTypeError("manifest: state_hashes must hold steps + 1 hashes, steps >= 1", code="state_hashes")

    @property
    def run_id(self) -> bytes:
        return self.digest

    def __hash__(self) -> int:  # dict/list fields make the generated hash unusable
        return hash(self.digest)


@dataclass(frozen=True)
class Claim(SignedMessage):
    """"I intend to replay ``step`` of ``run`` until ``lease_expiry``" — a hint, never a verdict."""

    KIND: ClassVar[str] = "claim"
    MAX_SIZE: ClassVar[int] = MAX_CLAIM_SIZE
    SIGNER: ClassVar[str] = "claimant"
    SCHEMA: ClassVar[Mapping[str, FieldType]] = {
        "run": _HASH,
        "step": UInt(),
        "slot": UInt(maximum=255),
        "claimant": _KEY,
        "issued_at": UInt(),
        "lease_expiry": UInt(),
    }

    run: bytes
    step: int
    slot: int
    claimant: bytes
    issued_at: int
    lease_expiry: int

    def _check_semantics(self) -> None:
        if self.lease_expiry <= self.issued_at:
            raise WrongTypeError("claim: lease_expiry must be after issued_at", code="lease_order")


@dataclass(frozen=True)
class Attestation(SignedMessage):
    """"I replayed ``step`` of ``run`` from ``pre_state`` and got ``post_state``": the verdict says
    whether that equals the run's published h_{step+1}."""

    KIND: ClassVar[str] = "attestation"
    MAX_SIZE: ClassVar[int] = MAX_ATTESTATION_SIZE
    SIGNER: ClassVar[str] = "signer"
    SCHEMA: ClassVar[Mapping[str, FieldType]] = {
        "run": _HASH,
        "step": UInt(),
        "pre_state": _HASH,
        "post_state": _HASH,
        "verdict": Enum(frozenset({MATCH, MISMATCH})),
        "engine": Text(max_length=64),
        "engine_version": Text(max_length=64),
        "hardware": Text(max_length=128),
        "elapsed_ms": UInt(),
        "signer": _KEY,
        "issued_at": UInt(),
    }

    run: bytes
    step: int
    pre_state: bytes
    post_state: bytes
    verdict: str
    engine: str
    engine_version: str
    hardware: str
    elapsed_ms: int
    signer: bytes
    issued_at: int
