"""Which step to replay next: pure logic, no I/O, no clock (the caller passes ``now``).

Honest nodes spread out *before* they ever race for a claim: each ranks itself among the peers
it knows with a rendezvous hash of (run, step, peer key) and prefers steps where it ranks
first. Claims in the DHT then settle the races that remain. The same functions drive the daemon
and (later) the scale simulator, so what is measured there is what runs here.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterable, Mapping

from open1b.protocol import Claim, Coverage, StepStatus, is_live, peer_id_from_public_key, select_claim
from open1b.protocol.hashing import blake2b256

_RENDEZVOUS_TAG = b"open1b/rendezvous/v1"


def rendezvous_score(run: bytes, step: int, peer_key: bytes) -> bytes:
    return blake2b256(_RENDEZVOUS_TAG, run, struct.pack("<Q", step), peer_key)


def rendezvous_rank(run: bytes, step: int, me: bytes, peers: Iterable[bytes]) -> int:
    """0 if ``me`` scores lowest for this step among ``peers`` ∪ {me}, 1 if second, …"""
    mine = rendezvous_score(run, step, me)
    return sum(1 for p in set(peers) - {me} if rendezvous_score(run, step, p) < mine)


def target_attesters(status: StepStatus, redundancy: int) -> int:
    """A disputed step wants one independent opinion more than the redundancy target."""
    return redundancy + 1 if status is StepStatus.DISPUTED else redundancy


@dataclass(frozen=True)
class Candidate:
    step: int
    deficit: int  # attesters still wanted, net of live claims by others
    rank: int
    disputed: bool

    def order(self) -> tuple[bool, int, int, int]:
        return (not self.disputed, -self.deficit, self.rank, self.step)


def candidates(
    cov: Coverage,
    *,
    me: bytes,
    peers: Iterable[bytes],
    attested_by_me: set[int],
    claims_by_step: Mapping[int, list[Claim]],
    now: int,
) -> list[Candidate]:
    """Steps this node should consider replaying, best first."""
    peers = list(peers)
    out = []
    for s in cov.steps:
        if s.step in attested_by_me:
            continue  # a node never attests the same step twice
        attesters = set(s.auditors) | set(s.dissenters)
        busy = {
            c.claimant for c in claims_by_step.get(s.step, ())
            if is_live(c, now) and c.claimant != me
        }
        busy_unfinished = sum(1 for key in busy if peer_id_from_public_key(key) not in attesters)
        deficit = target_attesters(s.status, cov.redundancy) - len(attesters) - busy_unfinished
        if deficit > 0:
            rank = rendezvous_rank(cov.run, s.step, me, peers)
            out.append(Candidate(s.step, deficit, rank, s.status is StepStatus.DISPUTED))
    return sorted(out, key=Candidate.order)


def free_slot(records: Mapping[int, Claim | None], slots: int, *, me: bytes, attesters: set[str], now: int) -> int | None:
    """The first redundancy slot whose DHT record does not block a new claim by ``me``.

    A slot is free if it has no record, its lease has expired, it is already ours, or its
    claimant has finished (attested) the step.
    """
    for slot in range(slots):
        rec = records.get(slot)
        if rec is None or not is_live(rec, now) or rec.claimant == me or peer_id_from_public_key(rec.claimant) in attesters:
            return slot
    return None


def winner(claims: list[Claim]) -> Claim:
    return claims[select_claim(claims)]
