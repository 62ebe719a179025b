"""Discovery (node/discovery.py) against real py-libp2p hosts on loopback."""

import ipaddress
from contextlib import AsyncExitStack
from functools import partial

import trio
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from multiaddr import Multiaddr

from open1b.node.dialable import local_networks
from open1b.node.discovery import DISCOVERY_TIMEOUT_S, discover
from open1b.node.p2p import open_p2p

from .conftest import ident


def test_discovery_skips_addresses_it_cannot_dial_and_ends_at_its_bound():
    """A peer known only at another network's private address is not dialled (not even stored);
    a peer whose listener accepts and then stays silent holds discovery for one dial's bound at
    most; the live peer is dialled."""
    elsewhere = next(f"10.{k}.0.9" for k in range(90, 256)
                     if not any(ipaddress.ip_address(f"10.{k}.0.9") in n for n in local_networks()))
    silent_peer, nowhere_peer = ID.from_base58(ident(31).peer_id), ID.from_base58(ident(32).peer_id)
    accepted = []

    async def silent(stream) -> None:
        accepted.append(stream)
        await trio.sleep_forever()

    async def main():
        with trio.fail_after(DISCOVERY_TIMEOUT_S + 30):
            async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
                a = await stack.enter_async_context(open_p2p(ident(20), "127.0.0.1", 0))
                b = await stack.enter_async_context(open_p2p(ident(21), "127.0.0.1", 0))
                listeners = await nursery.start(partial(trio.serve_tcp, silent, 0, host="127.0.0.1"))
                silent_addr = Multiaddr(f"/ip4/127.0.0.1/tcp/{listeners[0].socket.getsockname()[1]}")
                store = a.host.get_peerstore()
                store.add_addrs(nowhere_peer, [Multiaddr(f"/ip4/{elsewhere}/tcp/4701")], 3600)
                assert store.addrs(nowhere_peer) == []  # never stored, so nothing dials it
                store.add_addrs(silent_peer, [silent_addr], 3600)
                b_id = ID.from_base58(b.peer_id)
                store.add_addrs(b_id, [Multiaddr(b.addrs[0].rsplit("/p2p/", 1)[0])], 3600)
                table = a.dht.routing_table
                for peer, addrs in ((b_id, store.addrs(b_id)), (silent_peer, [silent_addr]),
                                    (nowhere_peer, [Multiaddr(f"/ip4/{elsewhere}/tcp/4701")])):
                    assert await table.add_peer(PeerInfo(peer, addrs), skip_server_mode_check=True)
                started = trio.current_time()
                dialled = await discover(a, 8)  # b is reached by the walk or by a dial after it
                assert trio.current_time() - started <= DISCOVERY_TIMEOUT_S + 1
                assert set(dialled) <= {b.peer_id} and b.peer_id in a.connected_peers()
                assert accepted  # the silent peer was tried, and given up on
                nursery.cancel_scope.cancel()

    trio.run(main)
