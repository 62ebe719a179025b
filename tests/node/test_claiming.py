"""The claim agent's protocol, driven over an in-memory board with the DHT's semantics
(every write reaches one shared record store that keeps what ``select_claim`` prefers)."""

import trio

from open1b.node.claim_records import ClaimAgent, renewal_time
from open1b.node.planner import Candidate
from open1b.protocol import LEASE_ROUND_SECONDS, Claim, select_claim

from .conftest import ident


class Board:
    def __init__(self) -> None:
        self.records: dict[str, bytes] = {}
        self.announced: list[Claim] = []

    async def read(self, key):
        await trio.sleep(0)
        return self.records.get(key)

    async def write(self, key, value):
        await trio.sleep(0)
        old = self.records.get(key)
        if old is not None:
            claims = [Claim.decode(old), Claim.decode(value)]
            if claims[select_claim(claims)].encoded == old:
                return False
        self.records[key] = value
        return True

    async def announce(self, claim):
        self.announced.append(claim)


def agent(n, board, clock, lease_s=60):
    return ClaimAgent(ident(n), board, lease_s=lease_s, clock=clock, sleep=lambda s: trio.sleep(0))


def cand(step, slots=1, attesters=()):
    return Candidate(step, slots - len(attesters), False, 0, slots, frozenset(attesters))


def test_concurrent_claims_have_exactly_one_winner_per_slot(manifest):
    now = [1_800_000_000]
    board = Board()
    agents = [agent(50 + i, board, lambda: now[0]) for i in range(5)]
    won = []

    async def main():
        async with trio.open_nursery() as nursery:
            for a in agents:
                async def go(a=a):
                    claim = await a.try_claim(manifest.run_id, cand(3))
                    if claim:
                        won.append(claim)
                nursery.start_soon(go)

    trio.run(main)
    assert len(won) == 1 and won[0].encoded == next(iter(board.records.values()))
    assert sum(a.lost for a in agents) + sum(a.won for a in agents) >= 1


def test_no_claim_when_attesters_and_live_claims_cover_the_target(manifest):
    now = 1_800_000_000
    board = Board()
    a, b, c = (agent(60 + i, board, lambda: now) for i in range(3))
    done = cand(1, slots=2, attesters=[ident(60).public_key])  # a attested step 1

    async def main():
        assert await b.try_claim(manifest.run_id, done) is not None  # b takes the second place
        assert await c.try_claim(manifest.run_id, done) is None  # a done + b busy = 2: nothing left for c

    trio.run(main)


def test_expired_lease_is_retaken_and_own_live_claim_is_reused(manifest):
    now = [1_800_000_000]
    board = Board()
    a, b = agent(70, board, lambda: now[0]), agent(71, board, lambda: now[0])
    async def main():
        first = await a.try_claim(manifest.run_id, cand(0))
        assert first is not None
        assert await b.try_claim(manifest.run_id, cand(0)) is None  # live lease held by a
        assert (await a.try_claim(manifest.run_id, cand(0))).digest == first.digest  # a keeps its own claim
        now[0] += 61  # a's lease has expired
        retaken = await b.try_claim(manifest.run_id, cand(0))
        assert retaken is not None and retaken.claimant == ident(71).public_key

    trio.run(main)


def test_renewal_is_in_a_later_round_and_keeps_the_slot(manifest):
    """A renewal issued in the claim's own lease round would lose to it (earliest wins within a
    round); renewal_time waits for the next round, and the renewed claim then wins the slot."""
    now = [1_800_000_010]
    board = Board()
    a, b = agent(80, board, lambda: now[0], lease_s=3600), agent(81, board, lambda: now[0], lease_s=3600)

    async def main():
        first = await a.try_claim(manifest.run_id, cand(2))
        due = renewal_time(first, 3600)
        assert due == first.lease_expiry - 900 and due // LEASE_ROUND_SECONDS > first.issued_at // LEASE_ROUND_SECONDS
        now[0] = due
        fresh = await a.renew(first)
        assert fresh is not None and fresh.lease_expiry == due + 3600
        assert board.records[next(iter(board.records))] == fresh.encoded
        now[0] = first.lease_expiry + 1  # the first lease is over, the renewed one is not
        assert await b.try_claim(manifest.run_id, cand(2)) is None

    trio.run(main)


def test_short_lease_renews_only_after_its_round():
    claim = Claim.create(ident(82), run=bytes(32), step=0, slot=0, issued_at=1_800_000_000, lease_expiry=1_800_000_030)
    assert renewal_time(claim, 30) == 1_800_000_060  # after expiry: the lease lapses, then is retaken


def test_hold_renews_until_cancelled(manifest):
    now = [1_800_000_000]
    board = Board()

    async def sleep(seconds):
        now[0] += int(seconds)
        await trio.sleep(0)

    a = ClaimAgent(ident(83), board, lease_s=600, clock=lambda: now[0], sleep=sleep)

    async def main():
        claim = await a.try_claim(manifest.run_id, cand(4))
        with trio.move_on_after(0.2):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(a.hold, claim)
                while a.renewed < 3:
                    await trio.sleep(0.001)
                nursery.cancel_scope.cancel()
        held = Claim.decode(board.records[next(iter(board.records))])
        assert a.renewed >= 3 and held.claimant == ident(83).public_key and held.lease_expiry > claim.lease_expiry

    trio.run(main)
