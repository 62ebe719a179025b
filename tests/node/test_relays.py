"""Circuit relay v2 (node/relays.py) between real py-libp2p hosts on loopback: a relay R, a node
H that calls itself private, and a node D that knows H only by H's circuit address (as a peer
behind NAT is known: its LAN address is not dialable from elsewhere)."""

from contextlib import AsyncExitStack

import pytest
import trio
from libp2p.peer.id import ID
from multiaddr import Multiaddr

from open1b.node import relays
from open1b.node.blobs import BLOB_PROTOCOL, BlobCache, BlobError
from open1b.node.claim_records import ClaimRecords
from open1b.node.dialable import is_circuit
from open1b.node.p2p import NetworkError, open_p2p
from open1b.node.relays import RESERVE_BACKOFF_MAX_S, RESERVE_EVERY_S, RetryAfter
from open1b.protocol import Claim, Outcome, claim_key
from open1b.protocol.codec import encode

from .conftest import ident

TOPIC = "/open1b/test-relayed"
NOW = 1_800_000_000


async def _wait(condition) -> None:
    while not condition():
        await trio.sleep(0.05)


def test_a_private_node_reserves_is_dialled_through_the_relay_and_gossip_and_dht_cross_it_blobs_never(tmp_path):
    async def main():
        with trio.fail_after(90):
            async with AsyncExitStack() as stack:
                r = await stack.enter_async_context(open_p2p(ident(60), "127.0.0.1", 0, relay_service=True))
                # (no hole punching here: on loopback it would soon make H and D's connection direct)
                h = await stack.enter_async_context(open_p2p(ident(61), "127.0.0.1", 0, hole_punching=False))
                d = await stack.enter_async_context(open_p2p(ident(62), "127.0.0.1", 0, hole_punching=False))
                for node in (r, h, d):
                    node.register_record_validator("open1b", ClaimRecords())
                h.reachability = "private"
                await h.connect(r.addrs[0])
                await d.connect(r.addrs[0])

                # a relay that has not found itself public refuses reservations
                await _wait(lambda: r.relays.protocol.refused > 0)
                assert not h.relays.reserved and not h.circuit_addrs
                r.reachability = "public"
                with trio.fail_after(3 * RESERVE_EVERY_S):
                    await _wait(lambda: h.relays.reserved)
                served = r.relays.status()
                assert served["relay_reservations_served"] == 1 and served["relay_reservations_refused_full"] == 0
                assert r.relays.status()["relay_requests_refused"] == r.relays.protocol.refused > 0
                circuit = [a for a in h.addrs if is_circuit(a)]
                assert circuit == [f"{r.addrs[0]}/p2p-circuit/p2p/{h.peer_id}"]
                # identify pushed the new address to the relay's peerstore
                await _wait(lambda: any(is_circuit(a) for a in r.peer_addrs(h.peer_id)))

                # D knows H by its circuit address only, and reaches it through R
                h_id = ID.from_base58(h.peer_id)
                d.host.get_peerstore().add_addrs(h_id, [Multiaddr(circuit[0])], 3600)
                assert d.relays.kind(h.peer_id) == "none"
                for node in (h, d):
                    node.set_validator(TOPIC, lambda author, data: Outcome.ACCEPT)
                got = trio.Event()

                async def on_message(author: str, data: bytes) -> None:
                    if author == h.peer_id and data == b"from home":
                        got.set()

                await d.subscribe(TOPIC, on_message)
                await h.subscribe(TOPIC, lambda author, data: trio.sleep(0))
                stream = await d.open_stream(h.peer_id, "/ipfs/id/1.0.0")
                await stream.reset()
                assert d.relays.kind(h.peer_id) == "relayed" and h.relays.kind(d.peer_id) == "relayed"
                assert d.relays.circuits_dialled == 1
                assert d.relays.connection_kinds() == {r.peer_id: "direct", h.peer_id: "relayed"}

                # gossip from H reaches D over the circuit (R does not subscribe: it cannot forward)
                while not got.is_set():
                    await h.publish(TOPIC, b"from home")
                    with trio.move_on_after(1):
                        await got.wait()

                # a claim H writes to the DHT is read by D from the network
                claim = Claim.create(ident(61), run=bytes(32), step=3, slot=0, issued_at=NOW, lease_expiry=NOW + 60)
                key = claim_key(claim.run, claim.step, claim.slot)
                assert await h.put_record(key, claim.encoded)
                assert await d.get_record(key, from_network=True) == claim.encoded

                # blobs never cross a relay: D will not fetch from H, and H will not serve D
                source = tmp_path / "blob"
                source.write_bytes(b"x" * 5000)
                served = BlobCache(tmp_path / "h", 1 << 30)
                digest = served.add_file(source, pin=True)
                h.set_stream_handler(BLOB_PROTOCOL, served.serve)
                fetching = BlobCache(tmp_path / "d", 1 << 30)
                with pytest.raises(BlobError, match="relay"):
                    await fetching.fetch(d, digest, [h.peer_id])
                assert fetching.relayed_refused == 1
                raw = await d.open_stream(h.peer_id, BLOB_PROTOCOL)
                with pytest.raises(NetworkError):  # reset: at the request, or before it went out
                    await raw.send(encode({"digest": digest, "offset": 0, "length": 4096}))
                    await raw.receive(1 << 16)
                await _wait(lambda: served.relayed_refused >= 1)  # (it may also have seen the stream D reset)
                assert served.served_bytes == 0

    trio.run(main)


def test_a_relayed_connection_is_upgraded_to_a_direct_one_and_blobs_then_flow(tmp_path):
    """DCUtR on loopback, where nothing stands in the way: its first step, a plain dial of the
    addresses H announced (identify told D over the relayed connection), makes the connection
    direct — not a hole punch, so none is counted — and blobs then flow. A hole punch through two
    NATs: tests/node/test_hole_punch_nat.py."""

    async def main():
        with trio.fail_after(90):
            async with AsyncExitStack() as stack:
                r = await stack.enter_async_context(open_p2p(ident(63), "127.0.0.1", 0, relay_service=True))
                h = await stack.enter_async_context(open_p2p(ident(64), "127.0.0.1", 0))
                d = await stack.enter_async_context(open_p2p(ident(65), "127.0.0.1", 0))
                r.reachability, h.reachability = "public", "private"
                await h.connect(r.addrs[0])
                await d.connect(r.addrs[0])
                await _wait(lambda: h.relays.reserved)
                circuit = next(a for a in h.addrs if is_circuit(a))
                d.host.get_peerstore().add_addrs(ID.from_base58(h.peer_id), [Multiaddr(circuit)], 3600)
                assert await d.relays.dial(h.peer_id)
                await _wait(lambda: d.relays.kind(h.peer_id) == "direct")
                assert d.relays.hole_punch.attempts == h.relays.hole_punch.attempts == 0

                source = tmp_path / "blob"
                source.write_bytes(b"y" * 5000)
                served = BlobCache(tmp_path / "h", 1 << 30)
                digest = served.add_file(source, pin=True)
                h.set_stream_handler(BLOB_PROTOCOL, served.serve)
                path = await BlobCache(tmp_path / "d", 1 << 30).fetch(d, digest, [h.peer_id])
                assert path.read_bytes() == source.read_bytes() and served.relayed_refused == 0

    trio.run(main)


def test_a_relay_that_refuses_is_asked_again_after_a_backoff_that_doubles_up_to_a_bound():
    retry = RetryAfter()
    assert retry.due("r", 0.0)
    now, waits = 100.0, []
    for _ in range(12):  # refused each time it is asked, as soon as it may be asked
        retry.refused("r", now)
        wait = RESERVE_EVERY_S * 2 ** len(waits)
        if wait > RESERVE_BACKOFF_MAX_S:
            wait = RESERVE_BACKOFF_MAX_S
        assert not retry.due("r", now + wait - 0.01) and retry.due("r", now + wait)
        waits.append(wait)
        now += wait
    assert waits[:4] == [RESERVE_EVERY_S, 2 * RESERVE_EVERY_S, 4 * RESERVE_EVERY_S, 8 * RESERVE_EVERY_S]
    assert waits[-1] == RESERVE_BACKOFF_MAX_S
    assert retry.due("other", now)  # per relay
    retry.granted("r")  # a reservation forgets the refusals
    assert retry.due("r", now)
    retry.refused("r", now)
    assert not retry.due("r", now + RESERVE_EVERY_S / 2)  # the first wait again, not the last
    assert retry.due("r", now + RESERVE_EVERY_S)
    retry.keep_only({"other"})  # disconnected: forgotten, asked afresh if it connects again
    assert retry.due("r", now)


def test_a_private_node_backs_off_relays_that_refuse_and_tries_the_next_one(monkeypatch):
    """Every node offers the hop protocol and refuses while it is not public: a private node that
    asked the first WANTED_RELAYS candidates (by peer ID) at every round never reached a third
    that accepts, and asked the refusing ones every few seconds for as long as it ran."""
    monkeypatch.setattr(relays, "RESERVE_EVERY_S", 0.2)  # rounds and backoffs scale with it

    async def main():
        with trio.fail_after(60):
            async with AsyncExitStack() as stack:
                refusing = [await stack.enter_async_context(open_p2p(ident(n), "127.0.0.1", 0, relay_service=True))
                            for n in (74, 78)]
                accepting = await stack.enter_async_context(open_p2p(ident(70), "127.0.0.1", 0, relay_service=True))
                h = await stack.enter_async_context(open_p2p(ident(71), "127.0.0.1", 0, hole_punching=False))
                # the order candidates are asked in: the two that refuse come first
                assert sorted(r.peer_id for r in (*refusing, accepting))[-1] == accepting.peer_id
                accepting.reachability = "public"
                for r in (*refusing, accepting):
                    await h.connect(r.addrs[0])
                await _wait(lambda: len(h.relays._relay_candidates()) == 3)  # identified: all offer hop
                h.reachability = "private"
                await _wait(lambda: refusing[0].relays.protocol.refused >= 1)
                first = trio.current_time()
                await _wait(lambda: accepting.peer_id in h.relays.reserved)
                # the second slot is still wanted, so the refusing relays are still asked, ever more
                # rarely: a 4th refusal comes at least 0.2 + 0.4 + 0.8 s after the first (at every
                # round, 0.2 s apart, before)
                await _wait(lambda: refusing[0].relays.protocol.refused >= 4)
                assert trio.current_time() - first >= (1 + 2 + 4) * 0.2 - 0.1
                assert set(h.relays.reserved) == {accepting.peer_id}

    trio.run(main)
