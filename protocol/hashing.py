"""The one hash function of the protocol: BLAKE2b with a 32-byte digest."""

from __future__ import annotations

import hashlib

DIGEST_SIZE = 32


def blake2b256(*parts: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=DIGEST_SIZE)
    for part in parts:
        h.update(part)
    return h.digest()


def hasher() -> "hashlib._Hash":
    return hashlib.blake2b(digest_size=DIGEST_SIZE)
