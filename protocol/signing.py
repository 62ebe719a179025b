"""Domain-separated Ed25519 signatures over canonical CBOR.

What is signed is ``SIGNING_CONTEXT ‖ kind ‖ 0x00 ‖ canonical_cbor(body)`` where ``body`` is the
message map without its ``sig`` field. The context string pins the protocol and version; the
kind pins the message type, so a signature on a claim can never be replayed as an attestation
(or as a libp2p record, whose signatures carry libp2p's own prefixes).
"""

from __future__ import annotations

from typing import Any, Mapping

from .codec import encode
from .identity import Identity, verify_raw

# The version of every message (its ``v``). Changing a message schema, the signing bytes, a
# commitment's layout or a validation rule increments it (docs/protocol.md §12); the signing
# context carries it, so a signature of one version never verifies as another's.
PROTOCOL_VERSION = 2
SIGNING_CONTEXT = f"open1b/v{PROTOCOL_VERSION}/sig\0".encode()


def signing_bytes(kind: str, body: Mapping[str, Any]) -> bytes:
    return SIGNING_CONTEXT + kind.encode("ascii") + b"\x00" + encode(dict(body))


def sign(identity: Identity, kind: str, body: Mapping[str, Any]) -> bytes:
    return identity.sign_raw(signing_bytes(kind, body))


def verify(public_key: bytes, kind: str, body: Mapping[str, Any], signature: bytes) -> None:
    """Raise :class:`~open1b.protocol.errors.SignatureError` unless the signature verifies."""
    verify_raw(public_key, signing_bytes(kind, body), signature)
