"""Peers that stop answering are set aside (node/peer_liveness.py): the bookkeeping and the DHT
guard on trio's MockClock, then real hosts on loopback with one peer that goes silent."""

from contextlib import AsyncExitStack

import pytest
import trio
from libp2p.host.ping import ID as PING_PROTOCOL
from libp2p.kad_dht.common import PROTOCOL_ID as DHT_PROTOCOL
from trio.testing import MockClock

from open1b.node import peer_liveness
from open1b.node.claim_records import ClaimRecords
from open1b.node.p2p import NetworkError, open_p2p
from open1b.node.peer_liveness import (
    FORGET_AFTER_S,
    PROBE_FIRST_S,
    PROBE_MAX_S,
    UNANSWERED_AFTER_S,
    PeerLiveness,
    guard_dht_requests,
    probe_forever,
)
from open1b.protocol import Claim, claim_key

from .conftest import ident


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_silent_peer_is_set_aside_probed_at_doubling_intervals_and_let_back_when_it_answers():
    clock = _Clock()
    live = PeerLiveness(clock)
    live.unanswered("A", "DHT get")
    live.unanswered("A", "DHT put")  # already aside: its schedule does not restart
    assert not live.usable("A") and live.usable("B") and live.set_aside() == ["A"]
    assert live.due() == []
    intervals = []
    for _ in range(8):
        clock.now += live.next_probe_in()
        assert live.due() == ["A"]
        assert live.due() == []  # being probed: not handed out twice
        live.probe_failed("A")
        intervals.append(live.next_probe_in())
    assert intervals[:4] == [2 * PROBE_FIRST_S, 4 * PROBE_FIRST_S, 8 * PROBE_FIRST_S, 16 * PROBE_FIRST_S]
    assert max(intervals) == PROBE_MAX_S
    live.answered("A")
    assert live.usable("A") and live.set_aside() == []


def test_a_peer_silent_for_long_is_forgotten():
    clock = _Clock()
    live = PeerLiveness(clock)
    live.unanswered("A", "ping")
    clock.now = FORGET_AFTER_S + 1
    assert live.due() == ["A"]
    live.probe_failed("A")
    assert live.usable("A") and live.set_aside() == []


class _Peer(str):
    def to_base58(self) -> str:
        return str(self)


class _FakeDHT:
    """The five single-peer requests py-libp2p's DHT makes; peer "S" never answers."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []
        self.peer_routing, self.value_store, self.provider_store = _Part(self), _Part(self), _Part(self)


class _Part:
    def __init__(self, dht: _FakeDHT) -> None:
        self.dht = dht

    async def _answer(self, name: str, peer: _Peer):
        self.dht.asked.append((name, str(peer)))
        if peer == "S":
            await trio.sleep_forever()
        return "answer"

    async def _query_peer_for_closest(self, peer, key):
        return await self._answer("closest", peer)

    async def _get_from_peer(self, peer, key, return_record=False, return_closer_peers=False):
        return await self._answer("get", peer)

    async def _store_at_peer(self, peer, key, value, record=None):
        return await self._answer("store", peer)

    async def _send_add_provider(self, peer, key):
        return await self._answer("provide", peer)

    async def _get_providers_from_peer_with_closers(self, peer, key):
        return await self._answer("providers", peer)


def test_the_dht_waits_on_a_silent_peer_once_then_not_at_all():
    dht = _FakeDHT()
    live = PeerLiveness(trio.current_time)
    guard_dht_requests(dht, live)
    silent, other = _Peer("S"), _Peer("O")

    async def main():
        start = trio.current_time()
        assert await dht.value_store._get_from_peer(silent, b"k", return_closer_peers=True) == (None, [])
        assert trio.current_time() - start == UNANSWERED_AFTER_S
        assert not live.usable("S")
        # every request to it now fails at once, with what the DHT expects of a failed request
        assert await dht.peer_routing._query_peer_for_closest(silent, b"k") == []
        assert await dht.value_store._get_from_peer(silent, b"k") is None
        assert await dht.value_store._store_at_peer(silent, b"k", b"v") is False
        assert await dht.provider_store._send_add_provider(silent, b"k") is False
        assert await dht.provider_store._get_providers_from_peer_with_closers(silent, b"k") == ([], [])
        assert trio.current_time() - start == UNANSWERED_AFTER_S
        assert await dht.value_store._store_at_peer(other, b"k", b"v") == "answer"

    trio.run(main, clock=MockClock(autojump_threshold=0))
    assert dht.asked == [("get", "S"), ("store", "O")]


def test_the_probe_lets_a_peer_back_once_it_answers_a_ping():
    live = PeerLiveness(trio.current_time)
    answers = trio.Event()
    pinged: list[float] = []

    async def ping(peer: str) -> bool:
        pinged.append(trio.current_time())
        return answers.is_set()

    async def main():
        live.unanswered("S", "DHT get")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(probe_forever, live, ping)
            while len(pinged) < 3:
                await trio.sleep(0.5)
            assert not live.usable("S")
            answers.set()
            while not live.usable("S"):
                await trio.sleep(0.5)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=MockClock(autojump_threshold=0))
    assert pinged[:3] == [PROBE_FIRST_S, 3 * PROBE_FIRST_S, 7 * PROBE_FIRST_S]


def test_real_hosts_stop_asking_a_silent_peer_and_take_it_back_when_it_answers(monkeypatch, manifest):
    """Three hosts; the third accepts DHT and ping streams but never answers (as a peer across a
    split link does). A claim written and read twice asks it once; once it answers pings again it
    is asked again."""
    monkeypatch.setattr(peer_liveness, "UNANSWERED_AFTER_S", 2.0)
    asked = []

    async def silent(stream) -> None:
        asked.append(trio.current_time())
        await trio.sleep_forever()

    async def main():
        async with AsyncExitStack() as stack:
            nodes = [await stack.enter_async_context(open_p2p(ident(30 + i), "127.0.0.1", 0)) for i in range(3)]
            for node in nodes[1:]:
                await node.connect(nodes[0].addrs[0])
            for node in nodes:
                node.register_record_validator("open1b", ClaimRecords())
                await node.discover(8)
            a, b, s = nodes
            dht_handler = s.host.get_mux().handlers[DHT_PROTOCOL]
            ping_handler = s.host.get_mux().handlers[PING_PROTOCOL]
            s.host.set_stream_handler(DHT_PROTOCOL, silent)
            s.host.set_stream_handler(PING_PROTOCOL, silent)
            claim = Claim.create(ident(30), run=manifest.run_id, step=1, slot=0, issued_at=1_800_000_000,
                                 lease_expiry=1_800_000_060)
            key = claim_key(claim.run, claim.step, claim.slot)
            with trio.fail_after(60):
                assert await a.put_record(key, claim.encoded)
                assert s.peer_id not in a.connected_peers() and b.peer_id in a.connected_peers()
                first = len(asked)
                assert first >= 1
                assert await a.get_record(key, from_network=True) == claim.encoded
                assert await a.put_record(key, claim.encoded)
                assert len(asked) == first  # set aside: not asked again
                with pytest.raises(NetworkError, match="not answering"):  # nor sent anything else
                    await a.open_stream(s.peer_id, DHT_PROTOCOL)
                s.host.set_stream_handler(DHT_PROTOCOL, dht_handler)
                s.host.set_stream_handler(PING_PROTOCOL, ping_handler)
                while not a.liveness.usable(s.peer_id):
                    await trio.sleep(0.1)
                assert s.peer_id in a.connected_peers()
                assert await a.get_record(key, from_network=True) == claim.encoded

    trio.run(main)
