"""Identities and message authentication for simulated nodes — the one swappable part.

Two modes, chosen per simulation:

* ``real``: every claim and attestation is signed with Ed25519 (:class:`SimIdentity` only caches
  the key schedule, which :class:`~open1b.protocol.Identity` recomputes on every use), and every
  distinct claim read from the simulated DHT is authenticated once by ``Claim.decode``.
  :class:`MessageCache` remembers the result: ``decode`` is a pure function of the bytes, so a
  cache hit is exactly what decoding again would return.
* ``stand-in``: the same messages, encoded canonically and ordered by the same strict total
  order, but ``sign_raw`` returns a keyed BLAKE2b tag instead of an Ed25519 signature, and the
  cache is filled when a message is created, so nothing is verified. Signatures only matter to
  an adversary forging statements, which no simulated node does; the claim order breaks ties on
  the encoded bytes only between two claims by one claimant in one second.

tests/node/test_sim.py runs one seeded scenario in both modes and checks the outcome is the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import nacl.signing

from open1b.protocol import Claim, Identity
from open1b.protocol.hashing import blake2b256

MODES = ("real", "stand-in")


@dataclass(frozen=True, repr=False)
class SimIdentity(Identity):
    stand_in: bool = False

    @cached_property
    def _key(self) -> nacl.signing.SigningKey:  # type: ignore[override]
        return nacl.signing.SigningKey(self.seed)

    @cached_property
    def public_key(self) -> bytes:  # type: ignore[override]
        return bytes(self._key.verify_key)

    def sign_raw(self, message: bytes) -> bytes:
        if not self.stand_in:
            return super().sign_raw(message)
        return blake2b256(b"open1b/sim/stand-in-signature", self.seed, message) * 2  # 64 bytes, like Ed25519


def sim_identity(seed: int, index: int, mode: str) -> SimIdentity:
    if mode not in MODES:
        raise ValueError(f"crypto mode must be one of {MODES}")
    return SimIdentity(blake2b256(b"open1b/sim/identity", seed.to_bytes(8, "little"), index.to_bytes(8, "little")),
                       stand_in=mode == "stand-in")


class MessageCache:
    """``Claim.decode`` with a memory; in stand-in mode also the only way a claim decodes."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self._claims: dict[bytes, Claim] = {}
        self.verified = 0

    def remember(self, claim: Claim) -> None:
        if self.mode == "stand-in":
            self._claims[claim.encoded] = claim

    def decode(self, data: bytes) -> Claim:
        claim = self._claims.get(data)
        if claim is None:
            claim = Claim.decode(data)  # raises on anything that does not authenticate
            self._claims[data] = claim
            self.verified += 1
        return claim
