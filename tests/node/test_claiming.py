"""The claim agent's protocol, driven over an in-memory board with the DHT's semantics
(every write reaches one shared record store that keeps what ``select_claim`` prefers), on trio's
MockClock: leases, re-check delays and renewals run on virtual time."""

import random

import trio
from trio.testing import MockClock

from open1b.node.claim_records import ClaimAgent, renewal_time
from open1b.node.clock import Clock
from open1b.node.planner import Candidate
from open1b.protocol import LEASE_ROUND_SECONDS, Claim

from .conftest import ident
from .fakes import FakeClaimBoard

T0 = 1_800_000_000  # wall time at trio time 0


def agent(n, board, clock: Clock, lease_s=60):
    return ClaimAgent(ident(n), board, lease_s=lease_s, clock=clock.wall, sleep=clock.sleep, rng=random.Random(n))


def run_virtual(main):
    return trio.run(main, clock=MockClock(autojump_threshold=0))


def cand(step, slots=1, attesters=()):
    return Candidate(step, slots - len(attesters), False, 0, slots, frozenset(attesters))


def test_concurrent_claims_have_exactly_one_winner_per_slot(manifest):
    clock = Clock(wall_at_zero=T0)
    board = FakeClaimBoard()
    agents = [agent(50 + i, board, clock) for i in range(5)]
    won = []

    async def main():
        async with trio.open_nursery() as nursery:
            for a in agents:
                async def go(a=a):
                    claim = await a.try_claim(manifest.run_id, cand(3))
                    if claim:
                        won.append(claim)
                nursery.start_soon(go)

    run_virtual(main)
    assert len(won) == 1 and won[0].encoded == next(iter(board.records.values()))
    assert sum(a.lost for a in agents) + sum(a.won for a in agents) >= 1


def test_no_claim_when_attesters_and_live_claims_cover_the_target(manifest):
    clock = Clock(wall_at_zero=T0)
    board = FakeClaimBoard()
    a, b, c = (agent(60 + i, board, clock) for i in range(3))
    done = cand(1, slots=2, attesters=[ident(60).public_key])  # a attested step 1

    async def main():
        assert await b.try_claim(manifest.run_id, done) is not None  # b takes the second place
        assert await c.try_claim(manifest.run_id, done) is None  # a done + b busy = 2: nothing left for c

    run_virtual(main)


def test_expired_lease_is_retaken_and_own_live_claim_is_reused(manifest):
    clock = Clock(wall_at_zero=T0)
    board = FakeClaimBoard()
    a, b = agent(70, board, clock), agent(71, board, clock)

    async def main():
        first = await a.try_claim(manifest.run_id, cand(0))
        assert first is not None
        assert await b.try_claim(manifest.run_id, cand(0)) is None  # live lease held by a
        assert (await a.try_claim(manifest.run_id, cand(0))).digest == first.digest  # a keeps its own claim
        await trio.sleep(61)  # a's lease has expired
        retaken = await b.try_claim(manifest.run_id, cand(0))
        assert retaken is not None and retaken.claimant == ident(71).public_key

    run_virtual(main)


def test_renewal_is_in_a_later_round_and_keeps_the_slot(manifest):
    """A renewal issued in the claim's own lease round would lose to it (earliest wins within a
    round); renewal_time waits for the next round, and the renewed claim then wins the slot."""
    t0 = 1_800_000_010
    clock = Clock(wall_at_zero=t0)
    board = FakeClaimBoard()
    a, b = agent(80, board, clock, lease_s=3600), agent(81, board, clock, lease_s=3600)

    async def main():
        first = await a.try_claim(manifest.run_id, cand(2))
        due = renewal_time(first, 3600)
        assert due == first.lease_expiry - 900 and due // LEASE_ROUND_SECONDS > first.issued_at // LEASE_ROUND_SECONDS
        await trio.sleep_until(due - t0)
        fresh = await a.renew(first)
        assert fresh is not None and fresh.lease_expiry == due + 3600
        assert board.records[next(iter(board.records))] == fresh.encoded
        await trio.sleep_until(first.lease_expiry + 1 - t0)  # the first lease is over, the renewed one is not
        assert await b.try_claim(manifest.run_id, cand(2)) is None

    run_virtual(main)


def test_short_lease_renews_only_after_its_round():
    claim = Claim.create(ident(82), run=bytes(32), step=0, slot=0, issued_at=1_800_000_000, lease_expiry=1_800_000_030)
    assert renewal_time(claim, 30) == 1_800_000_060  # after expiry: the lease lapses, then is retaken


def test_hold_renews_until_cancelled(manifest):
    clock = Clock(wall_at_zero=T0)
    board = FakeClaimBoard()
    a = agent(83, board, clock, lease_s=600)

    async def main():
        claim = await a.try_claim(manifest.run_id, cand(4))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(a.hold, claim)
            while a.renewed < 3:
                await trio.sleep(1)
            nursery.cancel_scope.cancel()
        held = Claim.decode(board.records[next(iter(board.records))])
        assert a.renewed == 3 and held.claimant == ident(83).public_key and held.lease_expiry > claim.lease_expiry
        # renewed at each quarter-lease mark (the first after the claim's own lease round)
        assert held.issued_at == renewal_time(Claim.decode(board.announced[-2].encoded), 600)

    run_virtual(main)


def test_leases_over_hours_of_protocol_time_a_crashed_holder_is_retaken_after_its_lease(manifest):
    """Virtual time (trio's MockClock): six hours of a held one-hour lease, a crash, and the
    retake, in milliseconds. While the holder renews, the other node never wins the slot; once it
    stops renewing, the slot is free again exactly when its last lease runs out."""
    clock = Clock(wall_at_zero=T0)
    board = FakeClaimBoard()
    lease_s = 3600
    holder = agent(84, board, clock, lease_s=lease_s)
    other = agent(85, board, clock, lease_s=lease_s)
    crash_at = 6 * 3600

    async def main():
        claim = await holder.try_claim(manifest.run_id, cand(5))
        assert claim is not None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(holder.hold, claim)
            while trio.current_time() < crash_at:  # the other node keeps trying, once a minute
                assert await other.try_claim(manifest.run_id, cand(5)) is None
                await trio.sleep(60)
            nursery.cancel_scope.cancel()  # kill -9: no release, the lease just stops being renewed
        last = Claim.decode(next(iter(board.records.values())))
        assert last.claimant == ident(84).public_key and last.lease_expiry > clock.wall()
        while (retaken := await other.try_claim(manifest.run_id, cand(5))) is None:
            await trio.sleep(60)
        assert retaken.claimant == ident(85).public_key
        assert last.lease_expiry <= retaken.issued_at < last.lease_expiry + 60 + 2  # one poll (+ the re-check)
        return trio.current_time()

    elapsed = run_virtual(main)
    assert elapsed > crash_at  # hours of protocol time
    assert holder.renewed >= crash_at // lease_s  # the lease was renewed all along


class _BlindBoard(FakeClaimBoard):
    """A DHT whose storing peers are all out of reach (a network split): writes land nowhere a
    read can see, and every read finds nothing."""

    async def read(self, key):
        await trio.sleep(0)
        return None


def test_a_claim_heard_on_gossip_holds_its_slot_when_the_dht_shows_nothing(manifest):
    clock = Clock(wall_at_zero=T0)
    heard: list[Claim] = []

    def gossip(run, step, slot):
        return [c for c in heard if (c.run, c.step, c.slot) == (run, step, slot)]

    board = _BlindBoard()
    a = ClaimAgent(ident(90), board, lease_s=60, clock=clock.wall, sleep=clock.sleep, rng=random.Random(90),
                   heard=gossip)

    async def main():
        other = Claim.create(ident(91), run=manifest.run_id, step=5, slot=0, issued_at=T0, lease_expiry=T0 + 60)
        heard.append(other)
        assert await a.try_claim(manifest.run_id, cand(5)) is None  # its live claim, heard on gossip, is respected
        assert a.lost == 0 and board.records == {}  # nothing written
        # a slot nobody announced is taken on the agent's own say (the DHT took the write)
        mine = await a.try_claim(manifest.run_id, cand(6))
        assert mine is not None and mine.claimant == ident(90).public_key
        # a competitor in the same lease round but earlier, heard only by gossip, wins the re-check
        await trio.sleep(1)
        earlier = Claim.create(ident(92), run=manifest.run_id, step=7, slot=0, issued_at=T0, lease_expiry=T0 + 60)

        async def race(seconds):
            heard.append(earlier)  # arrives while the agent waits to re-check
            await trio.sleep(seconds)

        a.sleep = race
        assert await a.try_claim(manifest.run_id, cand(7)) is None and a.lost == 1

    run_virtual(main)


def test_a_claim_read_from_the_dht_is_told_only_when_it_wins_its_slot(manifest):
    """A DHT peer may still hold a claim that lost its slot (its claimant saw it lose and replays
    nothing). Told to the node, it would count as a replay in flight until its lease ran out — its
    class too (the class wait, docs/protocol.md §10.1): the devnet's CPU node took the last slot of
    a step another CPU node held because a GPU node's losing claim on the same slot looked in
    flight. A claim the DHT holds is told when it wins against those heard for the slot."""
    clock = Clock(wall_at_zero=T0)
    heard: list[Claim] = []
    told: list[Claim] = []
    board = FakeClaimBoard()
    a = ClaimAgent(ident(95), board, lease_s=60, clock=clock.wall, sleep=clock.sleep, rng=random.Random(95),
                   seen=told.append, heard=lambda run, step, slot: [c for c in heard if (c.step, c.slot) == (step, slot)])

    async def main():
        winner = Claim.create(ident(96), run=manifest.run_id, step=6, slot=0, issued_at=T0, lease_expiry=T0 + 60)
        loser = Claim.create(ident(97), run=manifest.run_id, step=6, slot=0, issued_at=T0 + 1, lease_expiry=T0 + 61)
        heard.append(winner)
        board.read = _returning(loser)
        assert await a.try_claim(manifest.run_id, cand(6)) is None  # the slot is the winner's
        assert told == []
        board.read = _returning(winner)  # a DHT that holds the winner tells it (it is stored: new to the node)
        heard.clear()
        assert await a.try_claim(manifest.run_id, cand(6)) is None and told == [winner]

    run_virtual(main)


def _returning(claim: Claim):
    async def read(key):
        await trio.sleep(0)
        return claim.encoded
    return read


def test_speculative_slot_bounds_unfinished_claims_to_one_beyond_the_target(manifest):
    """docs/protocol.md §10.1: a step whose two slots are held by slow claimants takes one
    speculative claim (slot 2, carrying expected_done) and no second one while it runs; once
    the speculative claimant attested, its slot is free for another."""
    clock = Clock(wall_at_zero=T0)
    board = FakeClaimBoard()
    slow1, slow2, fast, faster, other = (agent(70 + i, board, clock, lease_s=600) for i in range(5))
    spec = Candidate(5, 0, False, 0, 3, frozenset(), speculative=True)

    async def main():
        first = await slow1.try_claim(manifest.run_id, cand(5, slots=2), estimate_s=18 * 3600)
        second = await slow2.try_claim(manifest.run_id, cand(5, slots=2), estimate_s=18 * 3600)
        assert {first.slot, second.slot} == {0, 1}
        assert first.expected_done == first.issued_at + 18 * 3600
        assert await other.try_claim(manifest.run_id, cand(5, slots=2)) is None  # the target is held
        mine = await fast.try_claim(manifest.run_id, spec, estimate_s=3000, device="cuda/sm_90")
        assert mine is not None and mine.slot == 2 and mine.expected_done == mine.issued_at + 3000
        assert mine.device == "cuda/sm_90" and first.device is None  # the class it replays on, if it says (r21)
        assert await faster.try_claim(manifest.run_id, spec, estimate_s=2000) is None  # the bound
        await clock.sleep(LEASE_ROUND_SECONDS)  # a renewal wins only in a later lease round
        renewed = await fast.renew(mine)
        assert renewed.expected_done == mine.expected_done and renewed.device == mine.device  # a renewal repeats them
        # fast attested: its slot is free again for a speculative claim, never a fourth live one
        done = Candidate(5, 0, False, 0, 3, frozenset({fast.me}), speculative=True)
        await clock.sleep(LEASE_ROUND_SECONDS)  # over a finished claim of this round, the next round's wins
        again = await faster.try_claim(manifest.run_id, done, estimate_s=2000)
        assert again is not None and again.slot == 2

    run_virtual(main)


def test_a_claim_that_took_long_says_where_its_time_went(manifest, caplog):
    """A partitioned half's auditors made no claim for a whole split after one attempt begun at
    the split, and nothing in their logs said where that attempt was waiting."""
    clock = Clock(wall_at_zero=T0)
    board = FakeClaimBoard()
    write = board.write

    async def slow_write(key, value):
        await trio.sleep(40)
        return await write(key, value)

    board.write = slow_write
    a = agent(98, board, clock)
    caplog.set_level("INFO", logger="open1b.node.claims")
    assert run_virtual(lambda: a.try_claim(manifest.run_id, cand(4))) is not None
    assert "claiming step 4 of run" in caplog.text and "write 40 s" in caplog.text
    caplog.clear()
    assert run_virtual(lambda: agent(99, FakeClaimBoard(), clock).try_claim(manifest.run_id, cand(4))) is not None
    assert "claiming step" not in caplog.text  # a quick one is not logged
