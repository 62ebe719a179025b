"""Circuit relay v2 (issue 27): public nodes relay control traffic for nodes behind NAT.

* **Serving** (config ``relay_service``, on by default): the hop protocol with explicit limits
  (:data:`RELAY_LIMITS`), answered only while this node's reachability is ``public`` — a relay
  nobody can dial back is of no use to the nodes that reserve on it. py-libp2p's defaults (4
  reservations in all, 1 GiB and an hour per circuit) are too few slots and far too many bytes.
* **Reserving**: while this node's reachability is ``private`` it reserves a slot on up to
  :data:`WANTED_RELAYS` connected peers that offer the hop protocol, and announces
  ``<relay>/p2p-circuit`` addresses (:meth:`Relays.circuit_addrs`), pushed to its peers at once.
  A relay that refused (or failed) is asked again only after a backoff that doubles with each
  refusal in a row, up to :data:`RESERVE_BACKOFF_MAX_S` (:class:`RetryAfter`): every node offers
  the hop protocol and refuses while it is not public, so on a network of private nodes (a LAN,
  a devnet on loopback) each node would otherwise ask the same two peers again every few seconds,
  and never try a third one that might accept.
* **Dialling**: ``host.connect()`` refuses circuit addresses, and nothing in py-libp2p that
  dials by itself (the DHT, pubsub, reconnects) uses them; :meth:`Relays.dial` does, for
  :meth:`.p2p.P2P.open_stream` and discovery, each dial time-bounded.
* **Hole punching**: DCUtR upgrades a relayed connection to a direct one where the NATs allow
  (TCP simultaneous open; counted: attempts and successes).
* **Counting**: connections by kind (:meth:`Relays.connection_kinds`).

Relays carry control traffic only: gossip, DHT records, sync, spot-check challenges. A checkpoint
never crosses one (``node/bulk.py`` dials addresses that are not circuits; the libp2p blob path
refuses relayed streams, :mod:`.blobs`).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Callable

import trio
from libp2p.connection_types import ConnectionType
from libp2p.identity.identify_push.identify_push import push_identify_to_peers
from libp2p.peer.id import ID
from libp2p.peer.peerstore import PeerStoreError
from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
from libp2p.relay.circuit_v2.dcutr import DCUtRProtocol
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_PROTOCOL
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
from libp2p.relay.circuit_v2.resources import RelayLimits
from libp2p.relay.circuit_v2.transport import CircuitV2Transport
from multiaddr import Multiaddr

from .dialable import dialable, is_circuit

if TYPE_CHECKING:
    from .p2p import P2P

log = logging.getLogger(__name__)

RELAY_LIMITS = RelayLimits(
    duration=600,  # seconds one relayed connection may last (then it is dialled again, or hole-punched)
    # bytes relayed to one reserving peer (the spec's per-connection cap; py-libp2p counts it per
    # reservation): gossip, claims and sync of a run's statements, never a checkpoint
    data=16 << 20,
    max_circuit_conns=16,  # relayed connections at once to one reserving peer
    max_reservations=64,  # reserving peers at once (dialling through a relay also reserves)
    reservation_ttl=3600,
)
WANTED_RELAYS = 2  # relays a private node keeps a reservation on
RESERVE_EVERY_S = 5.0  # how often a private node looks for relays while it has fewer than it wants
RESERVE_TIMEOUT_S = 10.0
RESERVE_BACKOFF_MAX_S = 300.0  # the longest a relay that keeps refusing waits to be asked again
CIRCUIT_DIAL_TIMEOUT_S = 10.0
HOLE_PUNCH_TIMEOUT_S = 60.0  # one DCUtR exchange and its dials (py-libp2p: ~10 s each when a dial times out)


class _Relay(CircuitV2Protocol):
    """py-libp2p's relay, answering the hop protocol only while ``serving()`` says so."""

    def __init__(self, host, *, allow_hop: bool, serving: Callable[[], bool]) -> None:
        super().__init__(host, limits=RELAY_LIMITS, allow_hop=allow_hop)
        self._serving = serving
        self.refused = 0  # hop requests refused because this node is not public
        self.refused_full = 0  # reservations refused because RELAY_LIMITS' slots were all taken
        accept = self.resource_manager.can_accept_reservation  # (asked only for a new reservation)

        def counted(peer_id) -> bool:
            ok = accept(peer_id)
            self.refused_full += not ok
            return ok

        self.resource_manager.can_accept_reservation = counted

    def reservations_served(self) -> int:
        """Peers holding an unexpired reservation on this relay."""
        now = time.time()  # (py-libp2p stamps reservations with the wall clock)
        return sum(1 for r in self.resource_manager._reservations.values() if r.expires_at >= now)

    async def _handle_hop_stream(self, stream) -> None:
        if not self._serving():
            self.refused += 1
            await stream.reset()
            return
        try:
            await super()._handle_hop_stream(stream)
        except Exception as exc:  # an exception escaping a handler takes the host down
            log.info("relay hop stream from %s failed: %s", stream.muxed_conn.peer_id, exc)


class _HolePunch(DCUtRProtocol):
    """py-libp2p's DCUtR (TCP simultaneous open from the listening port: needs SO_REUSEPORT
    listeners, :mod:`.listen_port`), counting hole punches. It drives itself: every relayed
    connection gets up to 3 exchanges, each after a plain dial of the peer's direct addresses
    (not counted). A punch is the simultaneous dials that end an exchange; both sides dial, so
    each punch is counted once by the side that started the exchange (``attempts``,
    ``succeeded``) and once by the side that answered (``answered``). An exchange that failed
    before its dials is not a punch."""

    def __init__(self, host) -> None:
        super().__init__(host)
        self.attempts = self.succeeded = self.answered = 0

    async def initiate_hole_punch(self, peer_id: ID) -> bool:
        # Its streams and dials have no bound of their own, and its auto-drive loop awaits one
        # peer at a time: a peer that never answers would stop every later upgrade.
        with trio.move_on_after(HOLE_PUNCH_TIMEOUT_S):
            return await super().initiate_hole_punch(peer_id)
        log.info("hole punch to %s: no outcome in %.0f s, given up", peer_id, HOLE_PUNCH_TIMEOUT_S)
        return False

    async def _perform_hole_punch(self, peer_id: ID, addrs: list[Multiaddr], as_responder: bool = False) -> bool:
        ok = await super()._perform_hole_punch(peer_id, addrs, as_responder=as_responder)
        if as_responder:  # (py-libp2p's name: the exchange's initiator dials "as responder")
            self.attempts += 1
            self.succeeded += bool(ok)
            log.info("hole punch to %s: %s", peer_id, "direct" if ok else "failed, the connection stays relayed")
        else:
            self.answered += 1
        return ok

    async def _handle_dcutr_stream(self, stream) -> None:
        try:
            await super()._handle_dcutr_stream(stream)
        except Exception as exc:  # an exception escaping a handler takes the host down
            log.info("hole punch asked by %s failed: %s", stream.muxed_conn.peer_id, exc)


class RetryAfter:
    """When each relay that refused a reservation may be asked again: :data:`RESERVE_EVERY_S`
    after its first refusal, doubling with each refusal in a row up to :data:`RESERVE_BACKOFF_MAX_S`
    (a relay's reachability may change: it is asked again, but rarely). A reservation it grants
    forgets its refusals. Times are ``trio.current_time()`` seconds."""

    def __init__(self) -> None:
        self._refused: dict[str, tuple[int, float]] = {}  # relay -> (refusals in a row, when it may be asked)

    def due(self, relay: str, now: float) -> bool:
        return self._refused.get(relay, (0, now))[1] <= now

    def refused(self, relay: str, now: float) -> None:
        count = self._refused.get(relay, (0, now))[0] + 1
        self._refused[relay] = (count, now + min(RESERVE_EVERY_S * 2 ** (count - 1), RESERVE_BACKOFF_MAX_S))

    def granted(self, relay: str) -> None:
        self._refused.pop(relay, None)

    def keep_only(self, connected: set[str]) -> None:
        """Forget peers no longer connected (bounds the table; a peer that reconnects starts afresh)."""
        self._refused = {r: v for r, v in self._refused.items() if r in connected}


class Relays:
    """This node's relay roles; built by :func:`.p2p.open_p2p`, which runs :attr:`protocol` and
    :attr:`hole_punch` as services and :meth:`keep_reservations` as a task."""

    def __init__(self, p2p: P2P, *, serve: bool) -> None:
        self.p2p = p2p
        self.serve = serve
        roles = RelayRole.STOP | RelayRole.CLIENT | (RelayRole.HOP if serve else RelayRole(0))
        self.protocol = _Relay(p2p.host, allow_hop=serve, serving=lambda: p2p.reachability == "public")
        self.transport = CircuitV2Transport(p2p.host, self.protocol, RelayConfig(roles=roles, limits=RELAY_LIMITS))
        self.hole_punch = _HolePunch(p2p.host)
        self.reserved: dict[str, Multiaddr] = {}  # relay peer -> its address (without /p2p-circuit)
        self.retry = RetryAfter()
        self.circuits_dialled = 0
        self.circuit_dials_failed = 0

    # -- reserving ---------------------------------------------------------------------------
    def circuit_addrs(self) -> list[Multiaddr]:
        """``<relay address>/p2p/<relay>/p2p-circuit`` for each relay holding our reservation
        (the host appends ``/p2p/<us>``)."""
        return [Multiaddr(f"{addr}/p2p/{relay}/p2p-circuit") for relay, addr in self.reserved.items()]

    def _relay_candidates(self) -> list[str]:
        """Connected peers offering the hop protocol that we hold no reservation on and may ask now."""
        store = self.p2p.host.get_peerstore()
        found = []
        # (pruned by every connection, not by connected_peers(): a peer set aside for a moment as
        # silent keeps its backoff)
        self.retry.keep_only({p.to_base58() for p in self.p2p.host.get_connected_peers()})
        now = trio.current_time()
        for peer in self.p2p.connected_peers():
            if peer in self.reserved or self.kind(peer) != "direct" or not self.retry.due(peer, now):
                continue
            try:
                if str(HOP_PROTOCOL) in (store.get_protocols(ID.from_base58(peer)) or ()):
                    found.append(peer)
            except Exception:  # not identified yet
                continue
        return found

    async def keep_reservations(self, nursery: trio.Nursery) -> None:
        """While private, hold reservations on up to WANTED_RELAYS relays; drop those whose
        connection is gone (the relay forgets a reservation when the connection ends)."""
        while True:
            gone = [r for r in self.reserved if self.kind(r) != "direct"]
            for relay in gone:
                del self.reserved[relay]
            self.p2p.circuit_addrs = self.circuit_addrs()
            added = False
            if self.p2p.reachability == "private":
                for relay in self._relay_candidates()[:max(0, WANTED_RELAYS - len(self.reserved))]:
                    if await self.reserve(relay, nursery):
                        self.retry.granted(relay)
                        added = True
                    else:
                        self.retry.refused(relay, trio.current_time())
            if gone or added:
                with trio.move_on_after(RESERVE_TIMEOUT_S):
                    await push_identify_to_peers(self.p2p.host)  # our addresses changed: tell our peers
            await trio.sleep(RESERVE_EVERY_S)

    async def reserve(self, relay: str, nursery: trio.Nursery) -> bool:
        """Reserve a slot on ``relay`` (refreshed by py-libp2p until the connection ends)."""
        relay_id = ID.from_base58(relay)
        addrs = [a for a in self.p2p.host.get_peerstore().addrs(relay_id)
                 if not is_circuit(a) and dialable(a, self.p2p.networks) and "/ip4/" in str(a)]
        if not addrs:
            return False
        with trio.move_on_after(RESERVE_TIMEOUT_S):
            try:
                stream = await self.p2p.host.new_stream(relay_id, [HOP_PROTOCOL])
                try:
                    ok = await self.transport.reserve(stream, relay_id, nursery)
                finally:
                    await stream.close()
            except Exception as exc:
                log.info("reservation on relay %s failed: %s", relay, exc)
                return False
            if ok:
                self.reserved[relay] = Multiaddr(str(addrs[0]).split("/p2p/")[0])
                self.p2p.circuit_addrs = self.circuit_addrs()
                log.info("reserved a relay slot on %s: reachable at %s", relay, self.circuit_addrs()[-1])
            return ok
        log.info("reservation on relay %s: no answer in %.0f s", relay, RESERVE_TIMEOUT_S)
        return False

    # -- dialling ----------------------------------------------------------------------------
    def circuits_to(self, peer: str) -> list[Multiaddr]:
        """The circuit addresses we know for ``peer``, in the form a dial takes (none for a peer
        the peerstore does not know: the dial then fails as a NetworkError, not this)."""
        out = []
        try:
            known = self.p2p.host.get_peerstore().addrs(ID.from_base58(peer))
        except PeerStoreError:
            return []
        for addr in known:
            if is_circuit(addr) and dialable(addr, self.p2p.networks):
                relay_part = str(addr).split("/p2p-circuit")[0]
                out.append(Multiaddr(f"{relay_part}/p2p-circuit/p2p/{peer}"))
        return list(dict.fromkeys(out))

    async def dial(self, peer: str) -> bool:
        """Connect to ``peer`` through one of its relays; whether a connection now exists."""
        for addr in self.circuits_to(peer):
            with trio.move_on_after(CIRCUIT_DIAL_TIMEOUT_S):
                try:
                    await self.transport.dial(addr)
                    self.circuits_dialled += 1
                    return True
                except Exception as exc:
                    log.debug("circuit dial %s failed: %s", addr, exc)
            self.circuit_dials_failed += 1
        return False

    # -- what connects us --------------------------------------------------------------------
    def kind(self, peer: str) -> str:
        """``direct`` when some connection to ``peer`` is not relayed, ``relayed`` when all are,
        ``none`` without one."""
        try:
            conns = self.p2p.host.get_network().get_connections(ID.from_base58(peer))
        except Exception:
            conns = []
        if not conns:
            return "none"
        relayed = [_is_relayed(c) for c in conns]
        return "relayed" if all(relayed) else "direct"

    def connection_kinds(self) -> dict[str, str]:
        """Each connected peer's :meth:`kind`."""
        return {p.to_base58(): self.kind(p.to_base58()) for p in self.p2p.host.get_connected_peers()}

    def status(self) -> dict:
        """What ``status`` shows of how this node is connected (docs/node.md)."""
        kinds = self.connection_kinds()
        return {"connections": {k: sum(1 for v in kinds.values() if v == k) for k in ("direct", "relayed")},
                "peers": dict(sorted(kinds.items())), "relay_service": self.serve,
                "relay_requests_refused": self.protocol.refused, "relay_reservations_refused_full": self.protocol.refused_full,
                "relay_reservations_served": self.protocol.reservations_served(), "reserved_on": sorted(self.reserved),
                "circuits_dialled": self.circuits_dialled, "circuit_dials_failed": self.circuit_dials_failed,
                "hole_punches": {"attempts": self.hole_punch.attempts, "succeeded": self.hole_punch.succeeded,
                                 "answered": self.hole_punch.answered}}


def _is_relayed(conn) -> bool:
    try:
        if conn.get_connection_type() is ConnectionType.RELAYED:
            return True
        return any(is_circuit(a) for a in conn.get_transport_addresses())
    except Exception:
        return False


def stream_is_relayed(raw_stream) -> bool:
    """Whether a libp2p stream runs over a relayed connection."""
    return any(conn is not None and _is_relayed(conn)
               for conn in (getattr(raw_stream, "swarm_conn", None), getattr(raw_stream, "muxed_conn", None)))
