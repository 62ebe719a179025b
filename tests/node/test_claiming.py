"""The claim agent's protocol, driven over an in-memory board with the DHT's semantics
(every write reaches one shared record store that keeps what ``select_claim`` prefers)."""

import trio

from open1b.node.claiming import ClaimAgent
from open1b.protocol import Attestation, Claim, coverage, select_claim

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


def agent(n, board, clock):
    return ClaimAgent(ident(n), board, lease_s=60, clock=clock, sleep=lambda s: trio.sleep(0))


def _att(signer, manifest, step):
    return Attestation.create(signer, run=manifest.run_id, step=step, pre_state=manifest.state_hashes[step],
                              post_state=manifest.state_hashes[step + 1], verdict="match", engine=manifest.engine,
                              engine_version=manifest.engine_version, hardware="t", elapsed_ms=1, issued_at=1000)


def test_concurrent_claims_have_exactly_one_winner_per_slot(manifest):
    now = [1_800_000_000]
    board = Board()
    agents = [agent(50 + i, board, lambda: now[0]) for i in range(5)]
    cov = coverage(manifest, [], now=now[0], redundancy=1)
    won = []

    async def main():
        async with trio.open_nursery() as nursery:
            for a in agents:
                async def go(a=a):
                    claim = await a.try_claim(manifest, cov, 3)
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
    cov = coverage(manifest, [_att(ident(60), manifest, 1)], now=now, redundancy=2)

    async def main():
        assert await b.try_claim(manifest, cov, 1) is not None  # a attested, b takes the second place
        assert await c.try_claim(manifest, cov, 1) is None  # a done + b busy = 2: nothing left for c

    trio.run(main)


def test_expired_lease_is_retaken_and_own_live_claim_is_reused(manifest):
    now = [1_800_000_000]
    board = Board()
    a, b = agent(70, board, lambda: now[0]), agent(71, board, lambda: now[0])
    cov = coverage(manifest, [], now=now[0], redundancy=1)

    async def main():
        first = await a.try_claim(manifest, cov, 0)
        assert first is not None
        assert await b.try_claim(manifest, cov, 0) is None  # live lease held by a
        assert (await a.try_claim(manifest, cov, 0)).digest == first.digest  # a keeps its own claim
        now[0] += 61  # a's lease has expired
        retaken = await b.try_claim(manifest, cov, 0)
        assert retaken is not None and retaken.claimant == ident(71).public_key

    trio.run(main)
