"""Reachability by dial-back over a fresh connection (node/reachability.py): the verdict rule, the
dial-back itself against real listeners, and the request between real hosts on loopback."""

import functools
import random
from contextlib import AsyncExitStack

import pytest
import trio
from multiaddr import Multiaddr

from open1b.node.dialable import interface_ipv4s
from open1b.node.p2p import NetworkError, open_p2p, usable_addrs
from open1b.node.reachability import (
    DIALBACK_PROTOCOL,
    MAX_REQUEST,
    MAX_WAITING,
    DialBack,
    DialBackServer,
    ask,
    ask_peers,
    dht_client,
    dial_back,
    verdict,
)

from .conftest import ident
from .loopback_hosts import at_once, connected_to, tcp_listener


def test_verdict_needs_two_peers_to_agree_and_says_why():
    assert verdict([]).state == "unknown"
    one = verdict([DialBack("A", "203.0.113.7", True)])
    assert one.state == "unknown" and "1 of 1" in one.reason
    public = verdict([DialBack("A", "8.8.4.4", True), DialBack("B", "8.8.4.4", True), DialBack("C", "8.8.4.4", False)])
    assert public.state == "public" and "2 peers dialled back to 8.8.4.4" in public.reason
    nat = verdict([DialBack("A", "8.8.4.4", False), DialBack("B", "8.8.4.4", False)])
    assert nat.state == "private" and "behind NAT" in nat.reason
    # reached only at a private-range address: reachable on that network, not from the internet
    lan = verdict([DialBack("A", "192.168.1.20", True), DialBack("B", "192.168.1.20", True)])
    assert lan.state == "private" and "that network only" in lan.reason
    # a LAN neighbour reaching us says nothing of the internet, where a peer failed: private
    home = verdict([DialBack("A", "192.168.1.20", True), DialBack("B", "11.241.1.2", False)])
    assert home.state == "private" and "that network only" in home.reason and "behind NAT" in home.reason
    # ... but one internet peer reaching us and one failing is not yet a verdict
    assert verdict([DialBack("A", "8.8.4.4", True), DialBack("B", "8.8.4.4", False)]).state == "unknown"
    # a peer's latest answer replaces its earlier one: one peer cannot confirm twice
    assert verdict([DialBack("A", "8.8.4.4", True), DialBack("A", "8.8.4.4", True)]).state == "unknown"


def test_a_node_some_peers_cannot_dial_runs_the_dht_as_a_client():
    def client(*answers: DialBack) -> bool:
        return dht_client(verdict(list(answers)), list(answers))

    assert client(DialBack("A", "11.241.1.2", False), DialBack("B", "11.241.1.2", False))  # behind NAT
    assert client(DialBack("A", "192.168.1.20", True), DialBack("B", "11.241.1.2", False))  # a LAN sibling reached it
    # every asked peer reached it at a private-range address (a LAN, a devnet on loopback): a server,
    # or such a network would have no DHT at all
    assert not client(DialBack("A", "127.0.0.1", True), DialBack("B", "127.0.0.1", True))
    assert not client(DialBack("A", "8.8.4.4", True), DialBack("B", "8.8.4.4", True), DialBack("C", "8.8.4.4", False))


def test_dial_back_finds_a_libp2p_listener_and_nothing_else():
    async def main():
        async with open_p2p(ident(40), "127.0.0.1", 0) as node:
            assert await dial_back("127.0.0.1", node.listen_port)

        async def not_libp2p(stream):
            await stream.send_all(b"HTTP/1.1 400 Bad Request\r\n\r\n")

        async with trio.open_nursery() as nursery:
            port = await tcp_listener(nursery, not_libp2p)
            assert not await dial_back("127.0.0.1", port)
            nursery.cancel_scope.cancel()
        assert not await dial_back("127.0.0.1", port)  # nobody listens there now

    trio.run(main)


def test_peers_dial_back_to_the_address_they_see_once_per_peer_at_a_time():
    async def main():
        async with AsyncExitStack() as stack:
            nodes = [await stack.enter_async_context(open_p2p(ident(41 + i), "127.0.0.1", 0)) for i in range(3)]
            for node in nodes[1:]:
                await node.connect(nodes[0].addrs[0])
            await nodes[2].connect(nodes[1].addrs[0])
            dialled = []

            async def recording_dial(host, port):
                dialled.append((host, port))
                return await dial_back(host, port)

            for node in nodes:
                node.set_stream_handler(DIALBACK_PROTOCOL, DialBackServer(recording_dial).handle)
            me = nodes[0]
            found = verdict(await ask_peers(me, me.listen_port, random.Random(1)))
            assert found.state == "private" and "127.0.0.1" in found.reason and "that network only" in found.reason
            assert sorted(dialled) == [("127.0.0.1", me.listen_port)] * 2
            # again at once: each peer serves one dial-back per peer per 10 s
            assert await ask(me, nodes[1].peer_id, me.listen_port) is None
            # a port where no libp2p listener answers (as behind a NAT that drops new connections)
            third = nodes[2]
            answer = await ask(third, nodes[1].peer_id, 1)
            assert answer is not None and not answer.reached and answer.host == "127.0.0.1"

    trio.run(main)


def test_only_dialable_addresses_are_announced():
    async def main():
        async with open_p2p(ident(45), "0.0.0.0", 0) as node:
            port = node.listen_port
            assert node.addrs and all("/ip4/0.0.0.0/" not in a for a in node.addrs)
            assert {a.split("/")[2] for a in node.addrs} == set(interface_ipv4s())
            # what libp2p offers: the listen address, and where a peer observed us (a NAT's mapping)
            listening, observed = Multiaddr(f"/ip4/0.0.0.0/tcp/{port}"), Multiaddr("/ip4/8.8.4.4/tcp/61234")
            assert Multiaddr(f"/ip4/8.8.4.4/tcp/{port}") not in usable_addrs([listening, observed], lambda: node._listening, node.dialled_back_at)
            node.dialled_back_at = {"8.8.4.4"}  # peers' dial-backs reached our listener there
            assert usable_addrs([listening, observed], lambda: node._listening, node.dialled_back_at)[-1] == Multiaddr(f"/ip4/8.8.4.4/tcp/{port}")
            assert observed not in usable_addrs([listening, observed], lambda: node._listening, node.dialled_back_at)

    trio.run(main)


def test_dial_back_requests_wait_in_a_bounded_line_and_a_malformed_one_is_penalised():
    """One dial at a time, once per key per 10 s: fresh keys (each free) asking at once all waited
    for the one dial, each holding its stream (6 keys at a port that accepts and never greets: 6
    held, answered one by one). Now at most MAX_WAITING wait; the others are refused at once."""
    keys = [ident(110 + i) for i in range(6)]
    penalised = []

    async def main():
        with trio.fail_after(60):
            async with AsyncExitStack() as stack:
                nursery = await stack.enter_async_context(trio.open_nursery())
                server = await stack.enter_async_context(open_p2p(ident(109), "127.0.0.1", 0))
                served = DialBackServer(functools.partial(dial_back, timeout_s=1.0), penalise=penalised.append)
                server.set_stream_handler(DIALBACK_PROTOCOL, served.handle)
                askers = await connected_to(stack, server, keys)

                async def silent(stream):
                    await trio.sleep_forever()

                port = await tcp_listener(nursery, silent)
                answers = await at_once(lambda asker: ask(asker, server.peer_id, port), askers)
                answered = [a for a in answers if a is not None]
                assert len(answers) == 6 and 1 <= len(answered) <= 1 + MAX_WAITING, answers
                assert not any(a.reached for a in answered)
                bad = await askers[0].open_stream(server.peer_id, DIALBACK_PROTOCOL)
                await bad.send(b"\xff" * 8)  # not CBOR
                with pytest.raises(NetworkError):
                    await bad.receive(MAX_REQUEST)
                assert penalised == [keys[0].peer_id]
                nursery.cancel_scope.cancel()

    trio.run(main)
