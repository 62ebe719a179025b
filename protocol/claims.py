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

from typing import Sequence

from .messages import Claim

# Leases are arbitrated in rounds of this many seconds: a claim issued in a later round
# supersedes any claim of an earlier one; within a round the earliest claim wins.
LEASE_ROUND_SECONDS = 60
MAX_LEASE_SECONDS = 3600
CLAIM_NAMESPACE = "open1b"


def claim_key(run: bytes, step: int, slot: int) -> str:
    return f"/{CLAIM_NAMESPACE}/claim/{run.hex()}/{step}/{slot}"


def claim_precedence(claim: Claim) -> tuple[int, int, bytes, bytes]:
    """Sort key: the claim with the smallest key wins."""
    return (-(claim.issued_at // LEASE_ROUND_SECONDS), claim.issued_at, claim.claimant, claim.encoded)


def select_claim(claims: Sequence[Claim]) -> int:
    """Index of the winning claim among ``claims`` (non-empty)."""
    return min(range(len(claims)), key=lambda i: claim_precedence(claims[i]))


def is_live(claim: Claim, now: int) -> bool:
    return claim.issued_at <= now < claim.lease_expiry
