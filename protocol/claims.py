"""Claim records and the strict total order that arbitrates between them.

A claim lives in the DHT under :func:`claim_key` (one key per run, step and redundancy slot).
Storing nodes and readers keep whichever valid record :func:`claim_precedence` ranks first; the
order must be *total and strict* so that every node converges on the same record however the
records reached it (an order with ties — "keep what you have" — splits the network).

Order: the newest lease round first (so an expired lease can be retaken by a newer claim), then
the earliest issue time, then the lowest claimant key, then the lowest encoded bytes (which
makes the order strict even between two claims of one claimant).
"""

from __future__ import annotations

import struct
from typing import Sequence

from .errors import InvalidStatementError, ProtocolError
from .hashing import blake2b256
from .messages import Claim

# Leases are arbitrated in rounds of this many seconds: a claim issued in a later round
# supersedes any claim of an earlier one; within a round the earliest claim wins.
LEASE_ROUND_SECONDS = 60
MAX_LEASE_SECONDS = 3600
CLAIM_NAMESPACE = "open1b"
_CLAIM_KEY_TAG = b"open1b/claim-key/v1\0"


def claim_key(run: bytes, step: int, slot: int) -> str:
    """``/open1b/c/<32 hex digits>``: 42 bytes. DHT servers may refuse longer keys (py-libp2p
    answers FIND_NODE only for keys of at most 50 bytes that are not multihashes), and a node
    must be able to store its claims at every implementation's servers."""
    digest = blake2b256(_CLAIM_KEY_TAG, run, struct.pack("<QB", step, slot))
    return f"/{CLAIM_NAMESPACE}/c/{digest[:16].hex()}"


def claim_precedence(claim: Claim) -> tuple[int, int, bytes, bytes]:
    """Sort key: the claim with the smallest key wins."""
    return (-(claim.issued_at // LEASE_ROUND_SECONDS), claim.issued_at, claim.claimant, claim.encoded)


def select_claim(claims: Sequence[Claim]) -> int:
    """Index of the winning claim among ``claims`` (non-empty)."""
    return min(range(len(claims)), key=lambda i: claim_precedence(claims[i]))


def is_live(claim: Claim, now: int) -> bool:
    return claim.issued_at <= now < claim.lease_expiry


def validate_claim_record(key: str, value: bytes) -> Claim:
    """The claim a DHT record holds, if it is a valid claim stored under its own key; raises otherwise."""
    claim = Claim.decode(value)
    if claim_key(claim.run, claim.step, claim.slot) != key:
        raise InvalidStatementError(f"a claim for {claim_key(claim.run, claim.step, claim.slot)} stored under {key}",
                                    code="claim_key")
    return claim


def select_claim_record(key: str, values: Sequence[bytes]) -> int | None:
    """Index of the record every node must prefer among ``values`` (invalid ones never win), or
    None when none is valid. The answer depends only on the set of values, not their order."""
    valid: list[tuple[int, Claim]] = []
    for index, value in enumerate(values):
        try:
            valid.append((index, validate_claim_record(key, value)))
        except ProtocolError:
            continue
    if not valid:
        return None
    return min(valid, key=lambda item: claim_precedence(item[1]))[0]
