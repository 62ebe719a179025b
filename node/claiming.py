"""Taking a claim: the I/O half of claiming, behind a small interface (:class:`ClaimBoard`) so
that the daemon drives it over the real DHT and gossip and a simulator drives the very same code
over a simulated network and clock.

Protocol (see docs/protocol.md, "Claims in the DHT"): read every redundancy slot of the step
from the network; take the first free slot; write the claim; announce it on gossip; wait a
moment and read the slot again — only if the network then shows *our* claim is compute spent.
A lost race costs a few lookups; a stolen or lost claim costs at most a duplicate replay,
never a wrong verdict.
"""

from __future__ import annotations

import random
from typing import Awaitable, Callable, Protocol

from open1b.protocol import (
    Claim, Coverage, Identity, Open1bError, RunManifest, claim_key, is_live, peer_id_from_public_key,
)

from . import claims as planner

# A claim we hold is renewed rather than reused when it has less than this left to run.
RENEW_MARGIN_S = 5
RECHECK_DELAY_S = (0.05, 0.2)


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
        rng: random.Random | None = None,
    ) -> None:
        self.identity, self.board, self.lease_s = identity, board, lease_s
        self.clock, self.sleep, self.seen = clock, sleep, seen
        self.rng = rng or random.Random()
        self.won = 0
        self.lost = 0

    async def _read(self, key: str) -> Claim | None:
        value = await self.board.read(key)
        if value is None:
            return None
        try:
            claim = Claim.decode(value)
        except Open1bError:
            return None
        self.seen(claim)
        return claim

    async def try_claim(self, manifest: RunManifest, cov: Coverage, step: int) -> Claim | None:
        """Claim a free redundancy slot of ``step``; returns our claim if the network shows it."""
        status = cov.steps[step]
        attesters = set(status.auditors) | set(status.dissenters)
        slots = planner.target_attesters(status.status, cov.redundancy)
        now = self.clock()
        records = {s: await self._read(claim_key(manifest.run_id, step, s)) for s in range(slots)}
        # The coverage we planned with may be stale: with the slots just read, is the step
        # still short of attesters once others' unfinished live claims are counted?
        busy = {c.claimant for c in records.values() if c is not None and is_live(c, now)
                and c.claimant != self.identity.public_key and peer_id_from_public_key(c.claimant) not in attesters}
        if len(attesters) + len(busy) >= slots:
            return None
        slot = planner.free_slot(records, slots, me=self.identity.public_key, attesters=attesters, now=now)
        if slot is None:
            return None
        held = records.get(slot)
        if held is not None and held.claimant == self.identity.public_key and held.lease_expiry > now + RENEW_MARGIN_S:
            self.won += 1
            return held
        mine = Claim.create(self.identity, run=manifest.run_id, step=step, slot=slot, issued_at=now,
                            lease_expiry=now + self.lease_s)
        self.seen(mine)
        key = claim_key(manifest.run_id, step, slot)
        if not await self.board.write(key, mine.encoded):
            self.lost += 1
            return None
        await self.board.announce(mine)
        # Re-check before spending compute: a concurrent claim may have won the order.
        await self.sleep(self.rng.uniform(*RECHECK_DELAY_S))
        current = await self._read(key)
        if current is not None and current.digest != mine.digest:
            self.lost += 1
            return None
        self.won += 1
        return mine
