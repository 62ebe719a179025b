"""The syncer's timing on trio's MockClock: bootstrap retries with backoff until a peer answers or
dials in, then sync rounds every ``sync_interval_s`` with a peer the injected RNG picks."""

from __future__ import annotations

import random

import pytest
import trio
from trio.testing import MockClock

from open1b.node.clock import Clock
from open1b.node.p2p import NetworkError
from open1b.node.sync import BOOTSTRAP_MAX_RETRY_S, Syncer

from .conftest import ident
from .fakes import FakeGossip, make_ledger


class FlakyNetwork(FakeGossip):
    """No bootstrap peer answers; peers appear when the test says so; every stream fails."""

    def __init__(self) -> None:
        super().__init__()
        self.peers: list[str] = []
        self.dials: list[float] = []
        self.opened: list[str] = []

    def set_stream_handler(self, protocol, handler) -> None:
        pass

    async def connect(self, addr: str) -> str:
        self.dials.append(trio.current_time())
        raise NetworkError(f"{addr}: connection refused")

    def connected_peers(self) -> list[str]:
        return list(self.peers)

    async def discover(self, max_peers: int) -> list[str]:
        return []

    async def open_stream(self, peer_id: str, protocol: str, *older: str):
        self.opened.append(peer_id)
        raise NetworkError(f"{peer_id}: stream reset")


def test_bootstrap_backs_off_until_a_peer_dials_in_then_rounds_pick_peers_with_the_rng(tmp_path):
    net = FlakyNetwork()
    ingest = make_ledger(tmp_path / "node", clock=Clock(wall_at_zero=1_800_000_000), gossip=net,
                         bootstrap=(f"/ip4/127.0.0.1/tcp/4701/p2p/{ident(9).peer_id}",), sync_interval_s=2.0)
    syncer = Syncer(net, ingest.statements, ingest.config, clock=ingest.statements.clock, rng=random.Random(7),
                    stats=ingest.statements.stats)

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(syncer.serve_syncer)
            await trio.sleep(60)
            assert not syncer.bootstrapped.is_set()
            gaps = [b - a for a, b in zip(net.dials, net.dials[1:])]
            assert gaps[:6] == pytest.approx([0.2, 0.4, 0.8, 1.6, 3.2, 6.4])  # doubling from 0.2 s
            assert max(gaps) == pytest.approx(BOOTSTRAP_MAX_RETRY_S)  # up to 10 s
            assert net.opened == []  # no peer yet: no sync round has anyone to ask
            net.peers = ["peer-a", "peer-b", "peer-c"]  # peers dial us
            with trio.fail_after(BOOTSTRAP_MAX_RETRY_S + 1):
                await syncer.bootstrapped.wait()
            before = len(net.opened)
            await trio.sleep(20 * 2.0 + 0.5)
            nursery.cancel_scope.cancel()
        return before

    before = trio.run(main, clock=MockClock(autojump_threshold=0))
    rounds = net.opened[before:]
    assert len(rounds) == 20  # one failed stream per round, each survived
    # the peers are the injected RNG's choices (a few rounds may have run while bootstrap slept)
    rng = random.Random(7)
    replay = [rng.choice(net.peers) for _ in range(40)]
    assert any(replay[k:k + 20] == rounds for k in range(10))


@pytest.mark.integration
def test_a_node_that_hears_no_gossip_learns_a_run_through_the_runs_sync_protocol(tmp_path):
    """Two real libp2p hosts on loopback; the joiner never subscribes to the runs topic, so the run
    can reach it only through ``/open1b/sync/runs``: it is learned, counted as synced, and its
    statements follow in the same round. (The publish integration test cannot pin the path: on a
    loaded machine a stretched gossipsub heartbeat can still hand its late joiner the manifest.)"""
    from open1b.node.p2p import open_p2p
    from tests.runs import attestation, run_manifest

    wall = 1_800_000_000
    run = run_manifest(ident(0), engine="test-engine", engine_version="1", model={"d": 1}, data={}, seed=0, steps=2,
                       state_hashes=[bytes([k]) * 32 for k in range(3)], created_at=wall - 100)
    att = attestation(ident(0), run=run.run_id, step=0, pre_state=run.state_hashes[0], post_state=run.state_hashes[1],
                      verdict="match", engine="test-engine", engine_version="1", hardware="t",
                      device="cpu/x86_64-avx2", elapsed_ms=1, issued_at=wall)

    async def main():
        async with open_p2p(ident(1), "127.0.0.1", 0) as holder_p2p, open_p2p(ident(2), "127.0.0.1", 0) as joiner_p2p:
            holder = make_ledger(tmp_path / "holder", run, clock=Clock(wall_at_zero=wall), gossip=holder_p2p)
            assert holder.statements.ingest_attestation(att.encoded)
            joiner = make_ledger(tmp_path / "joiner", clock=Clock(wall_at_zero=wall), gossip=joiner_p2p)
            Syncer(holder_p2p, holder.statements, holder.config, clock=holder.statements.clock, rng=random.Random(1),
                   stats=holder.statements.stats)  # its stream handlers answer the joiner
            syncer = Syncer(joiner_p2p, joiner.statements, joiner.config, clock=joiner.statements.clock,
                            rng=random.Random(1),
                            stats=joiner.statements.stats)
            peer = await joiner_p2p.connect(holder_p2p.addrs[0])
            assert await syncer.sync_with(peer) == 2  # the manifest, then its attestation
            assert list(joiner.manifests) == [run.run_id] and joiner.statements.runs_synced == 1
            assert [a.encoded for a in joiner.store.attestations(run.run_id)] == [att.encoded]

    trio.run(main)


class _HeldClock(Clock):
    t = 0.0

    def now(self) -> float:
        return self.t


@pytest.mark.integration
def test_a_peer_syncing_without_pause_is_served_once_a_second(tmp_path, manifest):
    """A peer that syncs at interval 0 cost its peer a quarter of a core: now each peer gets at
    most one answer per run (and one run list) every MIN_SYNC_INTERVAL_S; the rest are reset,
    without blame, and another peer is served meanwhile."""
    from contextlib import AsyncExitStack

    from open1b.node.config import MIN_SYNC_INTERVAL_S
    from open1b.node.p2p import open_p2p
    from open1b.node.sync import pull_attestations, pull_manifests

    async def main():
        with trio.fail_after(60):
            async with AsyncExitStack() as stack:
                server, greedy, other = [await stack.enter_async_context(open_p2p(ident(30 + i), "127.0.0.1", 0))
                                         for i in range(3)]
                ledger = make_ledger(tmp_path / "server", manifest, gossip=server)
                held = _HeldClock()  # time moves only when the test says
                Syncer(server, ledger.statements, ledger.config, clock=held, rng=random.Random(0), stats=ledger.statements.stats)
                for peer in (greedy, other):
                    await peer.connect(server.addrs[0])

                async def nothing(frames) -> int:
                    return 0

                async def statements(node) -> bool:
                    try:
                        await pull_attestations(node, server.peer_id, manifest.run_id, nothing)
                        return True
                    except NetworkError:
                        return False

                async def runs(node) -> bool:
                    try:
                        await pull_manifests(node, server.peer_id, lambda run: True, lambda data: trio.sleep(0))
                        return True
                    except NetworkError:
                        return False

                served = [await statements(greedy) for _ in range(20)]
                listed = [await runs(greedy) for _ in range(20)]
                assert served == [True] + [False] * 19 and listed == [True] + [False] * 19
                assert await statements(other) and await runs(other)
                held.t += MIN_SYNC_INTERVAL_S * 0.9
                assert not await statements(greedy)
                held.t += MIN_SYNC_INTERVAL_S * 0.1
                assert await statements(greedy) and await runs(greedy)
                assert server.rejected == {}

    trio.run(main)
