"""Ed25519 identities: one 32-byte seed is a node's libp2p key *and* its attestation signer.

A libp2p peer ID for an Ed25519 key is the identity multihash of the key's protobuf encoding
(``PublicKey{Type: Ed25519, Data: key}``), written in base58btc — the familiar ``12D3KooW…``.
Because the 32-byte key is embedded verbatim, anyone can map a peer ID back to the key that
must have signed that peer's statements; no directory is needed. This module computes the
mapping itself so the protocol library does not depend on libp2p.
"""

from __future__ import annotations

from dataclasses import dataclass

import nacl.exceptions
import nacl.signing

from .errors import SignatureError, WrongTypeError

SEED_SIZE = 32
PUBLIC_KEY_SIZE = 32
SIGNATURE_SIZE = 64

# identity multihash (0x00), length 36, then protobuf: field 1 varint KeyType.Ed25519 = 1,
# field 2 bytes of length 32.
_PEER_ID_PREFIX = bytes([0x00, 0x24, 0x08, 0x01, 0x12, 0x20])
_B58_ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def _b58encode(data: bytes) -> str:
    number = int.from_bytes(data, "big")
    out = []
    while number:
        number, rem = divmod(number, 58)
        out.append(_B58_ALPHABET[rem])
    leading_zeros = len(data) - len(data.lstrip(b"\0"))
    return "1" * leading_zeros + "".join(reversed(out))


def _b58decode(text: str) -> bytes:
    number = 0
    for char in text:
        index = _B58_ALPHABET.find(char)
        if index < 0:
            raise WrongTypeError(f"invalid base58 character {char!r}")
        number = number * 58 + index
    body = number.to_bytes((number.bit_length() + 7) // 8, "big")
    leading_ones = len(text) - len(text.lstrip("1"))
    return b"\0" * leading_ones + body


def peer_id_from_public_key(public_key: bytes) -> str:
    """The libp2p peer ID (base58btc) of a raw 32-byte Ed25519 public key."""
    if len(public_key) != PUBLIC_KEY_SIZE:
        raise WrongTypeError(f"Ed25519 public key must be {PUBLIC_KEY_SIZE} bytes")
    return _b58encode(_PEER_ID_PREFIX + public_key)


def public_key_from_peer_id(peer_id: str) -> bytes:
    """The Ed25519 key embedded in a peer ID; raises if the ID is not an Ed25519 identity ID."""
    raw = _b58decode(peer_id)
    if len(raw) != len(_PEER_ID_PREFIX) + PUBLIC_KEY_SIZE or not raw.startswith(_PEER_ID_PREFIX):
        raise WrongTypeError(f"{peer_id!r} is not an Ed25519 identity peer ID")
    return raw[len(_PEER_ID_PREFIX):]


@dataclass(frozen=True)
class Identity:
    """A signing identity. ``seed`` is secret; everything else may be published."""

    seed: bytes

    def __post_init__(self) -> None:
        if len(self.seed) != SEED_SIZE:
            raise WrongTypeError(f"identity seed must be {SEED_SIZE} bytes")

    def __repr__(self) -> str:  # never print the seed
        return f"Identity({self.peer_id})"

    @property
    def _key(self) -> nacl.signing.SigningKey:
        return nacl.signing.SigningKey(self.seed)

    @property
    def public_key(self) -> bytes:
        return bytes(self._key.verify_key)

    @property
    def peer_id(self) -> str:
        return peer_id_from_public_key(self.public_key)

    def sign_raw(self, message: bytes) -> bytes:
        """Ed25519 signature over ``message`` exactly; callers add domain separation (see signing)."""
        return self._key.sign(message).signature


# Strict Ed25519 verification (docs/protocol.md §5.4): libsodium's rules, stated and checked here
# so that the verdict does not depend on how the bundled libsodium was built.
_P = 2**255 - 19  # the field prime
_L = 2**252 + 27742317777372353535851937790883648493  # the order of the base point
_Y8 = 2707385501144840649318225287225658788936804267575313519463743609750303402022  # y of a point of order 8
# The y-coordinates (sign bit cleared; values >= p are non-canonical spellings) of the points of
# order 1, 2, 4 and 8: a key or an R among them makes a signature meaningless.
_SMALL_ORDER_Y = frozenset({0, 1, _P - 1, _Y8, _P - _Y8, _P, _P + 1})


def _y(encoded_point: bytes) -> int:
    return int.from_bytes(encoded_point, "little") & ((1 << 255) - 1)


def strict_signature_defect(public_key: bytes, signature: bytes) -> str | None:
    """Which strict rule (§5.4 rules 1-4) ``public_key`` and ``signature`` break, if any; rule 5,
    the verification equation, is libsodium's."""
    if len(public_key) != PUBLIC_KEY_SIZE or len(signature) != SIGNATURE_SIZE:
        return "malformed key or signature length"
    if int.from_bytes(signature[32:], "little") >= _L:
        return "S is not below the group order L"
    if _y(public_key) >= _P:
        return "the key is not canonically encoded"
    if _y(public_key) in _SMALL_ORDER_Y:
        return "the key has small order"
    if _y(signature[:32]) in _SMALL_ORDER_Y:
        return "R has small order"
    return None


def verify_raw(public_key: bytes, message: bytes, signature: bytes) -> None:
    """Raise :class:`SignatureError` unless ``signature`` is ``public_key``'s over ``message``,
    under the strict rules of docs/protocol.md §5.4."""
    defect = strict_signature_defect(public_key, signature)
    if defect is not None:
        raise SignatureError(defect)
    try:
        nacl.signing.VerifyKey(public_key).verify(message, signature)
    except (nacl.exceptions.BadSignatureError, nacl.exceptions.ValueError, TypeError) as exc:
        raise SignatureError("signature does not verify") from exc
