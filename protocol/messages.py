"""The signed statements of the protocol: RunManifest, Claim and Attestation.

Each message travels as one canonical CBOR map ``{"kind", "v", <fields>, "sig"}``. Its identity
is the BLAKE2b-256 of those bytes (:attr:`SignedMessage.digest`), so a store can hold statements
as an append-only set and two stores merge by union. ``decode`` checks size, canonical form,
schema and signature, in that order, and builds nothing until all of them pass.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar, Mapping, TypeVar

from . import signing
from .signing import PROTOCOL_VERSION
from .codec import decode, encode
from .errors import WrongTypeError
from .fingerprints import committed as committed_fingerprints
from .hashing import blake2b256
from .identity import PUBLIC_KEY_SIZE, SIGNATURE_SIZE, Identity, peer_id_from_public_key
from .schema import Bytes, Enum, FieldType, ListOf, Optional, Scalars, Text, UInt, check_map

# The run format (docs/run-format.md): what a manifest commits to and how h_k is computed.
# Bumped when either changes; a node refuses runs of a format it does not read.
RUN_FORMAT = 2
HASH_SIZE = 32

MAX_MANIFEST_SIZE = 1 << 20
MAX_CLAIM_SIZE = 512
MAX_ATTESTATION_SIZE = 1024
# Manifests carry three 35-byte lists per step inline (state hashes, checkpoint addresses,
# witness commitments); this many steps keeps them inside MAX_MANIFEST_SIZE (~860 KB).
# Longer runs are split or use an external trajectory (docs/protocol.md).
MAX_INLINE_STEPS = 8192

# The class of device that replayed (docs/protocol.md §5.3): a backend, then the target the
# kernels were built for. A closed grammar, so coverage can group agreeing devices by name.
DEVICE_CLASS = re.compile(r"(cpu|cuda)/[a-z0-9_]{1,32}(-[a-z0-9_]{1,32})?", re.ASCII)
MAX_DEVICE_CLASS = 70  # "cuda/" and two 32-byte parts joined by "-"

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
        # An optional field left out is absent from the map, never null (schema.Optional).
        fields = {k: v for k, v in fields.items() if v is not None or not isinstance(self.SCHEMA[k], Optional)}
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
        fields = {k: v for k, v in fields.items() if v is not None or not isinstance(cls.SCHEMA.get(k), Optional)}
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
        cls._check_format(value)
        check_map({**_ENVELOPE, **cls.SCHEMA}, value, cls.KIND)
        fields = {name: value[name] for name in cls.SCHEMA if name in value}
        message = cls(sig=value["sig"], **fields)
        message._check_semantics()
        signing.verify(fields[cls.SIGNER], cls.KIND, message.body(), value["sig"])
        return message

    @classmethod
    def _check_format(cls, value: dict) -> None:
        """Checks that must come before the schema (a later format may change every field)."""

    def _check_semantics(self) -> None:
        """Cross-field rules a schema cannot express; subclasses extend."""


@dataclass(frozen=True)
class RunManifest(SignedMessage):
    """A trainer's signed description of a published run (run format 2, docs/run-format.md).

    ``state_hashes[k]`` is h_k, the commitment to the state before step k, and ``checkpoints[k]``
    the blob address (BLAKE2b-256 of the file) of that state's checkpoint: ``steps + 1`` entries
    each. ``witnesses[k]`` commits to step k's replay witness (``steps`` entries). The samples
    the batches are drawn from are committed by a Merkle root and by their file's blob address.
    The run is identified by :attr:`run_id`, the digest of the signed manifest.
    """

    KIND: ClassVar[str] = "manifest"
    MAX_SIZE: ClassVar[int] = MAX_MANIFEST_SIZE
    SIGNER: ClassVar[str] = "publisher"
    SCHEMA: ClassVar[Mapping[str, FieldType]] = {
        "format": UInt(maximum=255),
        "engine": Text(max_length=64),
        "engine_version": Text(max_length=64),
        "model": Scalars(max_entries=64),
        "data": Scalars(max_entries=16),
        "seed": UInt(),
        "steps": UInt(maximum=MAX_INLINE_STEPS),
        "state_hashes": ListOf(_HASH, max_length=MAX_INLINE_STEPS + 1),
        "checkpoints": ListOf(_HASH, max_length=MAX_INLINE_STEPS + 1),
        "witnesses": ListOf(_HASH, max_length=MAX_INLINE_STEPS),
        "samples_root": _HASH,
        "samples": UInt(),
        "samples_blob": _HASH,
        "samples_size": UInt(),
        "publisher": _KEY,
        "created_at": UInt(),
    }

    format: int
    engine: str
    engine_version: str
    model: dict[str, Any]
    data: dict[str, Any]
    seed: int
    steps: int
    state_hashes: list[bytes]
    checkpoints: list[bytes]
    witnesses: list[bytes]
    samples_root: bytes
    samples: int
    samples_blob: bytes
    samples_size: int
    publisher: bytes
    created_at: int

    @classmethod
    def _check_format(cls, value: dict) -> None:
        if value.get("format") != RUN_FORMAT or type(value.get("format")) is not int:
            raise WrongTypeError(
                f"manifest: run format {value.get('format')!r} is not supported; this node reads format {RUN_FORMAT}",
                code="run_format")

    def _check_semantics(self) -> None:
        if self.format != RUN_FORMAT:
            raise WrongTypeError(f"manifest: run format must be {RUN_FORMAT}", code="run_format")
        if self.steps < 1 or len(self.state_hashes) != self.steps + 1:
            raise WrongTypeError("manifest: state_hashes must hold steps + 1 hashes, steps >= 1", code="state_hashes")
        if len(self.checkpoints) != self.steps + 1:
            raise WrongTypeError("manifest: checkpoints must hold steps + 1 addresses", code="checkpoints")
        if len(self.witnesses) != self.steps:
            raise WrongTypeError("manifest: witnesses must hold one commitment per step", code="witnesses")
        if self.samples < 1:
            raise WrongTypeError("manifest: a run needs at least one sample", code="samples")
        committed_fingerprints(self.data)  # code fingerprints: both keys or neither, each a hex hash

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
        "expected_done": Optional(UInt()),
        "device": Optional(Text(max_length=MAX_DEVICE_CLASS)),
    }

    run: bytes
    step: int
    slot: int
    claimant: bytes
    issued_at: int
    lease_expiry: int
    # When the claimant expects to attest (unix seconds): its replay's start plus its own
    # replay-time estimate (docs/protocol.md §10.1). A hint for others' planning, like the claim.
    expected_done: int | None = None
    # The device class the claimant replays on (r21): so that a planner knows which class a step's
    # replay in flight is of before it attests (docs/protocol.md §10.1, the class wait). A hint too.
    device: str | None = None

    def _check_semantics(self) -> None:
        if self.lease_expiry <= self.issued_at:
            raise WrongTypeError("claim: lease_expiry must be after issued_at", code="lease_order")
        if self.device is not None and not DEVICE_CLASS.fullmatch(self.device):
            raise WrongTypeError(f"claim: {self.device!r} is not a device class", code="device")


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
        "device": Text(max_length=MAX_DEVICE_CLASS),
        "elapsed_ms": UInt(),
        "witness": _HASH,
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
    hardware: str  # free text for people: the CPU or GPU model
    device: str  # the device class, DEVICE_CLASS: what coverage groups matches by
    elapsed_ms: int
    witness: bytes  # B2 binding of the signer's replay witness to its key (docs/run-format.md §5)
    signer: bytes
    issued_at: int

    def _check_semantics(self) -> None:
        if not DEVICE_CLASS.fullmatch(self.device):
            raise WrongTypeError(f"attestation: {self.device!r} is not a device class", code="device")
