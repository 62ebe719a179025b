"""Finding more peers than the bootstrap ones: a DHT walk, then dials, every part time-bounded.

Unbounded, a node behind NAT sat minutes here (issue 27): the walk waited on peers it could not
reach, and each dial of another home's LAN address waited on a router that dropped it. Now the
walk takes at most DISCOVERY_WALK_S, each dial DIAL_TIMEOUT_S (the dials run at once), the whole
DISCOVERY_TIMEOUT_S; a peer with no address this node can dial (:mod:`.dialable`) is not tried,
and one known only by relayed addresses is dialled through its relay (:mod:`.relays`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo

from .dialable import dialable_only, is_circuit, local_networks

if TYPE_CHECKING:
    from .p2p import P2P

log = logging.getLogger(__name__)

DIAL_TIMEOUT_S = 5.0  # one connection attempt: a router that drops the SYN leaves a dial waiting minutes
DISCOVERY_WALK_S = 10.0
DISCOVERY_TIMEOUT_S = 20.0


async def discover(p2p: P2P, max_peers: int) -> list[str]:
    """Learn peers through the DHT (a FIND_NODE walk towards ourselves) and dial those we are not
    connected to, up to ``max_peers`` connections. Returns the peers dialled."""
    p2p.networks = local_networks()  # interfaces come and go (a laptop changes networks)
    host = p2p.host
    dialled: list[str] = []
    with trio.move_on_after(DISCOVERY_TIMEOUT_S):
        for peer in host.get_connected_peers():
            await p2p.dht.add_peer(peer)
        with trio.move_on_after(DISCOVERY_WALK_S):
            try:
                await p2p.dht.refresh_routing_table()
            except Exception as exc:  # an unreachable peer during the walk is routine
                log.debug("routing table refresh failed: %s", exc)
        connected = set(host.get_connected_peers())
        candidates = [peer for peer in p2p.dht.routing_table.get_peer_ids()
                      if peer not in connected and peer != host.get_id()
                      and peer.to_base58() not in p2p.banned and p2p.liveness.usable(peer.to_base58())]
        async with trio.open_nursery() as nursery:
            for peer in candidates[:max(0, max_peers - len(connected))]:
                nursery.start_soon(_dial, p2p, peer, dialled)
    return dialled


async def _dial(p2p: P2P, peer: ID, dialled: list[str]) -> None:
    addrs = [a for a in dialable_only(p2p.host.get_peerstore().addrs(peer), p2p.networks) if not is_circuit(a)]
    if not addrs:  # behind NAT: through one of its relays, bounded there (DCUtR may then punch a hole)
        if await p2p.relays.dial(peer.to_base58()):
            dialled.append(peer.to_base58())
        return
    with trio.move_on_after(DIAL_TIMEOUT_S):
        try:
            await p2p.host.connect(PeerInfo(peer, addrs))
            dialled.append(peer.to_base58())
        except Exception as exc:
            log.debug("cannot dial discovered peer %s: %s", peer, exc)
