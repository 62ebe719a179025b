"""Claim records: taking a claim (:class:`ClaimAgent`), the I/O half of claiming, behind a small
interface (:class:`ClaimBoard`) so that the daemon drives it over the real DHT and gossip
(:class:`DhtClaimBoard`) and a simulator drives the very same code over a simulated network and
clock; and the DHT's rule for ``/open1b/claim/…`` records (:class:`ClaimRecords`).

Protocol (see docs/protocol.md, "Claims in the DHT"): read every redundancy slot of the step
from the network; take a free slot (:func:`~open1b.node.planner.free_slot`); write the claim; wait
a moment and read the slot again — only if the network then shows *our* claim is it announced on
gossip and compute spent.
A lost race costs a few lookups; a stolen or lost claim costs at most a duplicate replay,
never a wrong verdict. Each read also weighs the claims for the slot heard on gossip, under the
same order, so a claim survives a split that cuts its storing peers off.

Leases are at most ``MAX_LEASE_SECONDS`` (an hour) while one Open-1B step takes from under an
hour (H100) to 18 hours (a 24 GB laptop), so a node keeps its claim alive with :meth:`ClaimAgent.hold`
beside a long replay: a fresh claim on the same slot, issued in a later lease round (which the
strict order prefers), before the old one runs out.
"""

from __future__ import annotations

import logging
import math
import random
from typing import TYPE_CHECKING, Awaitable, Callable, Iterable, Protocol

from open1b.protocol import LEASE_ROUND_SECONDS, Claim, Identity, Open1bError, claim_key, is_live, select_claim

from . import planner
from .topics import claims_topic

if TYPE_CHECKING:  # the simulator drives this module without libp2p
    from .p2p import P2P

# A claim we hold is renewed rather than reused when it has less than this left to run.
RENEW_MARGIN_S = 5
# How long to wait before re-reading our claim. A competitor that read the slot just before our
# write landed writes about one DHT operation later (50–500 ms on the internet); if that lands
# after our re-check, and its claim wins the order (same second, lower key), both replay. Half a
# second to a second closes that window (docs/scale.md: duplicates at 2,000 nodes racing for
# 1,600 steps fell from 1.4 % to 0) and costs nothing next to a replay.
RECHECK_DELAY_S = (0.5, 1.0)
# A claim attempt that takes this long is logged with where its time went: each DHT operation
# has its own bound, yet in a partitioned devnet in CI both auditors of one half made no claim
# for the whole 240-s split after one attempt begun at the split (docs/reliability.md).
SLOW_CLAIM_S = 30

log = logging.getLogger("open1b.node.claims")


def renewal_time(claim: Claim, lease_s: int) -> int:
    """When to renew ``claim``: with a quarter of the lease (at least RENEW_MARGIN_S) left, but
    never in the lease round it was issued in — within a round the *earlier* claim wins, so a
    renewal there would lose to the claim it renews."""
    return max(claim.lease_expiry - max(RENEW_MARGIN_S, lease_s // 4),
               (claim.issued_at // LEASE_ROUND_SECONDS + 1) * LEASE_ROUND_SECONDS)


class ClaimBoard(Protocol):
    async def read(self, key: str) -> bytes | None:
        """The record the network currently prefers for ``key`` (not a local cache)."""

    async def write(self, key: str, value: bytes) -> bool:
        """Store ``value``; False if a record already held locally is preferred to it."""

    async def announce(self, claim: Claim) -> None:
        """Tell peers about the claim (gossip), so their coverage shows it."""


class ClaimAgent:
    def __init__(
        self,
        identity: Identity,
        board: ClaimBoard,
        *,
        lease_s: int,
        clock: Callable[[], int],
        sleep: Callable[[float], Awaitable[None]],
        seen: Callable[[Claim], None] = lambda claim: None,
        heard: Callable[[bytes, int, int], Iterable[Claim]] = lambda run, step, slot: (),
        rng: random.Random | None = None,
        decode: Callable[[bytes], Claim] = Claim.decode,
    ) -> None:
        self.identity, self.board, self.lease_s = identity, board, lease_s
        self.clock, self.sleep, self.seen = clock, sleep, seen
        # Claims for a slot that reached us otherwise (gossip announces every winning claim): a read
        # arbitrates between them and the DHT's answer under the same strict order, so a claim
        # whose storing peers we cannot reach (a network split) still holds its slot for us.
        self.heard = heard
        self.rng = rng or random.Random()
        # ``decode`` must authenticate like Claim.decode (a simulator passes a memo of it).
        self.decode = decode
        self.me = identity.public_key  # derived once: Identity derives the key on every access
        self.won = 0
        self.lost = 0
        self.renewed = 0

    async def _read(self, run: bytes, step: int, slot: int) -> Claim | None:
        value = await self.board.read(claim_key(run, step, slot))
        found = None
        if value is not None:
            try:
                found = self.decode(value)
            except Open1bError:
                pass
        candidates = ([found] if found is not None else []) + list(self.heard(run, step, slot))
        if not candidates:
            return None
        winner = candidates[select_claim(candidates)]
        # Only the slot's winner is told: a DHT peer may still hold a claim that lost the slot
        # (its claimant re-read, saw it lose and replays nothing), and a loser stored here would
        # count as a replay in flight until its lease ran out — its class in the class wait
        # (docs/protocol.md §10.1), the devnet's node taking a last slot its own class held.
        if winner is found:
            self.seen(found)
        return winner

    async def try_claim(self, run: bytes, cand: planner.Candidate, *, estimate_s: float | None = None,
                        waits: Callable[[int], bool] | None = None, device: str | None = None) -> Claim | None:
        """Claim a free redundancy slot of ``cand.step``; returns our claim if the network shows it.
        With ``estimate_s`` (the node's replay-time estimate) the claim carries ``expected_done``,
        and with ``device`` (the class the node replays on) its device class (docs/protocol.md §10.1).
        A speculative candidate (:func:`~open1b.node.planner.speculative_candidate`) has one slot
        more than the step wants, so the same rule lets it take that slot only while all others are
        held or attested. ``waits``: whether the class wait (docs/protocol.md §10.1) holds the
        step's last slot back from us, asked, with what the reads told stored (``seen``), when our
        claim would be the last the step wants."""
        step, slots, attesters, done = cand.step, cand.slots, cand.attesters, cand.done()
        now = self.clock()
        records = {s: await self._read(run, step, s) for s in range(slots)}
        read_at = self.clock()
        # The view we planned with may be stale: with the slots just read, is the step still
        # short of attesters once others' unfinished live claims are counted?
        busy = {c.claimant for c in records.values() if c is not None and is_live(c, now)
                and c.claimant != self.me and c.claimant not in done}
        if (len(busy) if cand.speculative else len(attesters) + len(busy)) >= slots:
            return None
        if waits is not None and not cand.speculative and len(attesters) + len(busy) == slots - 1 and waits(step):
            return None  # the plan may not have known these claims: their classes may make it wait
        slot = planner.free_slot(records, slots, me=self.me, attesters=done, now=now)
        if slot is None:
            return None
        held = records.get(slot)
        if held is not None and held.claimant == self.me and held.lease_expiry > now + RENEW_MARGIN_S:
            self.won += 1
            return held
        expected_done = None if estimate_s is None else now + math.ceil(estimate_s)
        mine = Claim.create(self.identity, run=run, step=step, slot=slot, issued_at=now, lease_expiry=now + self.lease_s,
                            expected_done=expected_done, device=device)
        self.seen(mine)
        key = claim_key(run, step, slot)
        written = await self.board.write(key, mine.encoded)
        written_at = self.clock()
        if not written:
            self.lost += 1
            return None
        # Re-check before spending compute: a concurrent claim may have won the order.
        await self.sleep(self.rng.uniform(*RECHECK_DELAY_S))
        current = await self._read(run, step, slot)
        checked_at = self.clock()
        if current is not None and current.digest != mine.digest:
            self.lost += 1
            return None
        # Announce only a claim that won: a losing claim on gossip would count as a live
        # claimant in every node's view until its lease ran out, hiding a free slot.
        await self.board.announce(mine)
        self.won += 1
        done_at = self.clock()
        if done_at - now >= SLOW_CLAIM_S:
            log.info("claiming step %d of run %s took %d s: reads %d s, write %d s, re-check %d s, announce %d s",
                     step, run.hex()[:12], done_at - now, read_at - now, written_at - read_at,
                     checked_at - written_at, done_at - checked_at)
        return mine

    async def renew(self, claim: Claim) -> Claim | None:
        """A fresh lease on the slot ``claim`` holds; None if the slot now holds a claim the
        order prefers (someone retook it — we keep replaying; at worst that is a duplicate)."""
        now = self.clock()
        fresh = Claim.create(self.identity, run=claim.run, step=claim.step, slot=claim.slot, issued_at=now,
                             lease_expiry=now + self.lease_s, expected_done=claim.expected_done, device=claim.device)
        self.seen(fresh)
        if not await self.board.write(claim_key(claim.run, claim.step, claim.slot), fresh.encoded):
            return None
        await self.board.announce(fresh)
        self.renewed += 1
        return fresh

    async def hold(self, claim: Claim) -> None:
        """Keep ``claim`` alive until cancelled (run it beside the replay) or until the slot is lost."""
        current: Claim | None = claim
        while current is not None:
            await self.sleep(max(0, renewal_time(current, self.lease_s) - self.clock()))
            try:
                current = await self.renew(current)
            except Open1bError:  # the network did not take it (a NetworkError): the lease still runs, retry soon
                await self.sleep(RENEW_MARGIN_S)


class DhtClaimBoard:
    """The claim agent's view of the network: DHT records plus the run's claims topic."""

    def __init__(self, p2p: P2P) -> None:
        self.p2p = p2p

    async def read(self, key: str) -> bytes | None:
        return await self.p2p.get_record(key, from_network=True)

    async def write(self, key: str, value: bytes) -> bool:
        return await self.p2p.put_record(key, value)

    async def announce(self, claim: Claim) -> None:
        await self.p2p.publish(claims_topic(claim.run), claim.encoded)


class ClaimRecords:
    """DHT validator for ``/open1b/claim/…``: a record must be a valid claim for its own key;
    among several, the protocol's strict total order picks one (invalid ones lose)."""

    def validate(self, key: str, value: bytes) -> None:
        claim = Claim.decode(value)
        if claim_key(claim.run, claim.step, claim.slot) != key:
            raise ValueError("claim stored under another key")

    def select(self, key: str, values: list[bytes]) -> int:
        parsed = []
        for value in values:
            try:
                parsed.append(Claim.decode(value))
            except Open1bError:
                parsed.append(None)
        valid = [i for i, c in enumerate(parsed) if c is not None]
        if not valid:
            return 0
        return valid[select_claim([parsed[i] for i in valid])]
