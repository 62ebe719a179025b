"""Reachability by dial-back over a fresh connection (node/reachability.py): the verdict rule, the
dial-back itself against real listeners, and the request between real hosts on loopback."""

import random
from contextlib import AsyncExitStack

import trio
from multiaddr import Multiaddr

from open1b.node.p2p import open_p2p, usable_addrs
from open1b.node.reachability import (
    DIALBACK_PROTOCOL,
    DialBack,
    DialBackServer,
    ask,
    ask_peers,
    dht_client,
    dial_back,
    interface_ipv4s,
    verdict,
)

from .conftest import ident


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
            listeners = await nursery.start(trio.serve_tcp, not_libp2p, 0)
            port = listeners[0].socket.getsockname()[1]
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
