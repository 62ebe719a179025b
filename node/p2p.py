"""With :mod:`.dht_store`, the only module that imports libp2p: one host with gossipsub, a Kademlia DHT and streams.

py-libp2p has sharp edges (see ../shared/notes/py-libp2p.md); this adapter files them down so
that the rest of the node sees a small, safe surface:

* start order: Pubsub and GossipSub run before the host listens, the DHT after; shutdown is the
  reverse, from one exit stack;
* every callback we hand to libp2p (topic validators, stream handlers, DHT record validators)
  is wrapped so that an exception is logged instead of tearing the host down. A topic validator
  that raises is our bug, not the sender's: the message is ignored and nobody is penalised;
* ``publish`` is paced on the peers' outbound queues, which drop silently when full;
* each subscription is drained by its own task, so a slow consumer never loses messages in
  libp2p's 32-slot channel;
* the DHT stores only records of our namespaces, within bounds (:mod:`.dht_store`);
* DHT reads that must see the network (claim re-checks) drop the local copy first, because
  ``get_value`` answers from local data without asking anyone;
* a peer that leaves a request unanswered (a DHT query, opening a stream) is set aside until it
  answers a ping (:mod:`.peer_liveness`): nothing connects a walk's timeouts to each other, and a
  split link leaves connections open but silent, so every walk waited on every unreachable peer.
"""

from __future__ import annotations

import inspect
import logging
import math
import socket
import traceback
import weakref
from contextlib import AsyncExitStack, asynccontextmanager
from typing import AsyncIterator, Awaitable, Callable, Protocol

import trio
from google.protobuf.message import DecodeError
from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.custom_types import TProtocol
from libp2p.host.ping import ID as PING_PROTOCOL
from libp2p.host.ping import perform_ping_roundtrip
from libp2p.io.exceptions import MessageTooLarge
from libp2p.network.config import ConnectionConfig
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.gossipsub import PROTOCOL_ID, PROTOCOL_ID_V11, GossipSub
from libp2p.pubsub.pubsub import Pubsub
from libp2p.records.validator import Validator
from libp2p.tools.anyio_service import background_trio_service
from libp2p.utils.varint import (
    decode_uvarint_from_stream,
    encode_uvarint,
    encode_varint_prefixed,
    read_varint_prefixed_bytes_limited,
)
from multiaddr import Multiaddr

from open1b.protocol import Identity, Open1bError, Outcome
from open1b.protocol.dispute.trace import Pieces

from .dht_store import BoundedKadDHT, DhtLimits
from .dialable import Networks, dialable_only, interface_ipv4s, local_networks
from .discovery import DIAL_TIMEOUT_S, discover
from .listen_port import socket_inode, strangers
from .peer_liveness import UNANSWERED_AFTER_S, PeerLiveness, guard_dht_requests, probe_forever
from .relays import Relays, stream_is_relayed

log = logging.getLogger(__name__)


class _FramedPubsub(Pubsub):
    """py-libp2p's pubsub, except that:

    * a frame that is not a pubsub RPC ends only its stream, as a malformed message from that peer
      (``malformed``: one reject). py-libp2p catches stream and varint errors there but not
      protobuf's ``DecodeError``, which went up through the connection and ended the whole host: a
      daemon exited on one frame (a loaded devnet's observer, mid-run);
    * one RPC at a time is written to a stream. Gossipsub writes to a peer's stream from many
      tasks (each forward, each control message), and py-libp2p's yamux takes its write lock per
      chunk: a write that runs out of send window waits with the lock released, and another
      write's chunks go in between. To a peer that reads slowly (a loaded machine), honest nodes
      then sent frames that are not RPCs, and it banned them for it (an under-load devnet)."""

    def __init__(self, host, router, *, malformed: Callable[[str], None]) -> None:
        super().__init__(host, router)
        self._malformed = malformed
        self._writing: weakref.WeakKeyDictionary[object, trio.Lock] = weakref.WeakKeyDictionary()

    async def write_msg(self, stream, rpc_msg) -> bool:
        lock = self._writing.setdefault(stream, trio.Lock())
        async with lock:
            return await super().write_msg(stream, rpc_msg)

    async def stream_handler(self, stream) -> None:
        try:
            await super().stream_handler(stream)
        except DecodeError:
            peer_id = stream.muxed_conn.peer_id
            log.info("peer %s sent a pubsub frame that is not an RPC: its stream is reset", peer_id)
            self._malformed(str(peer_id))
            await stream.reset()
            self._handle_dead_peer(peer_id)

# Publishing waits while any peer's outbound queue (32 slots in py-libp2p) holds this many RPCs.
PUBLISH_QUEUE_HIGH_WATER = 16
PUBLISH_PACING_TIMEOUT_S = 10.0
MAX_PUBSUB_MESSAGE = 1 << 20
# A large frame is written and read this many bytes at a time (send_pieces, receive_pieces):
# the bytes on the wire are the same as one write of the frame.
FRAME_PIECE = 256 << 10
# The longest one DHT operation (a walk and its queries) may take. py-libp2p bounds each query by
# its QUERY_TIMEOUT (10 s) but not the whole operation, so a walk over many unreachable peers (a
# network partition) could hold a claim, a publish or a fetch for as long as it liked.
DHT_OP_TIMEOUT_S = 30.0

GossipValidator = Callable[[str, bytes], Outcome]  # (author peer ID, data) -> outcome
AsyncGossipValidator = Callable[[str, str, bytes], Awaitable[Outcome]]  # (forwarding peer, author, data)
GossipHandler = Callable[[str, bytes], Awaitable[None]]
StreamHandler = Callable[["Stream"], Awaitable[None]]


class NetworkError(Open1bError):
    """A peer or the network did not do what we asked (unreachable, reset, timed out)."""


class FrameTooLarge(NetworkError):
    """A peer announced a frame over the bound the reader set: its fault (a protocol violation
    to penalise), where the other NetworkErrors may be the network's."""


class RecordValidator(Protocol):
    """What the DHT needs for one key namespace: ``validate`` raises, ``select`` ranks."""

    def validate(self, key: str, value: bytes) -> None: ...

    def select(self, key: str, values: list[bytes]) -> int: ...


class _SafeRecordValidator(Validator):
    def __init__(self, inner: RecordValidator) -> None:
        self._inner = inner

    def validate(self, key: str, value: bytes) -> None:
        self._inner.validate(key, value)  # raising is how libp2p expects a rejection

    def select(self, key: str, values: list[bytes]) -> int:
        try:
            return self._inner.select(key, values)
        except Exception:
            log.exception("DHT select failed for %s; keeping the first value", key)
            return 0


class Stream:
    """A length-prefixed message stream to one peer (varint frames, each bounded)."""

    def __init__(self, raw, peer_id: str) -> None:
        self._raw = raw
        self.peer_id = peer_id

    @property
    def relayed(self) -> bool:
        """Whether this stream runs through a relay (node/relays.py): control traffic only."""
        return stream_is_relayed(self._raw)

    @property
    def remote_host(self) -> str | None:
        """The IP address the peer's connection comes from, as this end sees it."""
        try:
            address = self._raw.get_remote_address()
        except Exception:
            return None
        return address[0] if address else None

    # py-libp2p raises many types for a peer's failure (resets, EOF, yamux and noise errors, an
    # oversized frame): here they all become one NetworkError, so callers catch exactly that.
    async def send(self, frame: bytes) -> None:
        await self._write(encode_varint_prefixed(frame))

    async def receive(self, max_size: int) -> bytes:
        try:
            return await read_varint_prefixed_bytes_limited(self._raw, max_size)
        except MessageTooLarge as exc:
            raise FrameTooLarge(f"{self.peer_id} sent a frame over {max_size} bytes") from exc
        except Exception as exc:
            raise NetworkError(f"receive from {self.peer_id} failed: {exc}") from exc

    async def send_pieces(self, body: Pieces) -> None:
        """One frame of ``body``'s bytes, read and written :data:`FRAME_PIECE` at a time: on the
        wire the same bytes as :meth:`send` of them whole (the varint length, then the bytes), so
        a peer reads it either way, and this end holds one piece at a time, not the frame. An
        error of ``body.read`` is raised as it is (the frame is then cut short: reset the stream)."""
        await self._write(encode_uvarint(body.nbytes))
        for offset in range(0, body.nbytes, FRAME_PIECE):
            piece = body.read(offset, FRAME_PIECE)
            if len(piece) != min(FRAME_PIECE, body.nbytes - offset):  # the frame's length is sent already
                raise ValueError(f"{body!r} gave {len(piece)} bytes at offset {offset} of {body.nbytes}")
            await self._write(piece)

    async def _write(self, data: bytes) -> None:
        try:
            await self._raw.write(data)
        except Exception as exc:
            raise NetworkError(f"send to {self.peer_id} failed: {exc}") from exc

    async def receive_pieces(self, max_size: int, write: Callable[[bytes], None]) -> int:
        """One frame, handed to ``write`` piece by piece as it arrives (at most
        :data:`FRAME_PIECE` bytes each; the frame is never held whole): its length.
        :class:`FrameTooLarge`, before a byte of it is read, if its length is over ``max_size``;
        :class:`NetworkError` if the stream ends before the frame does. An error of ``write`` is
        raised as it is."""
        try:
            size = await decode_uvarint_from_stream(self._raw)
        except Exception as exc:
            raise NetworkError(f"receive from {self.peer_id} failed: {exc}") from exc
        if size > max_size:
            raise FrameTooLarge(f"{self.peer_id} sent a frame over {max_size} bytes")
        left = size
        while left:
            try:
                piece = await self._raw.read(min(left, FRAME_PIECE))
            except Exception as exc:
                raise NetworkError(f"receive from {self.peer_id} failed: {exc}") from exc
            if not piece or len(piece) > left:
                raise NetworkError(f"a frame from {self.peer_id} ended {left} bytes early")
            write(piece)
            left -= len(piece)
        return size

    async def close(self) -> None:
        try:
            await self._raw.close()
        except Exception as exc:
            raise NetworkError(f"close of a stream to {self.peer_id} failed: {exc}") from exc

    async def reset(self) -> None:
        try:
            await self._raw.reset()
        except Exception:
            pass


class P2P:
    def __init__(self, identity: Identity, *, heartbeat_s: float = 1.0, mesh_degree: int = 4,
                 max_rejects_per_peer: int = 20, dht_limits: DhtLimits = DhtLimits(),
                 relay_service: bool = False, hole_punching: bool = True) -> None:
        self.identity = identity
        # Hosts at which peers' dial-backs reached our listener, and the verdict
        # (node/reachability.py sets both).
        self.dialled_back_at: set[str] = set()
        self.reachability = "unknown"
        self.circuit_addrs: list[Multiaddr] = []  # where relays forward to us (node/relays.py sets them)
        self.host = new_host(
            key_pair=create_new_key_pair(identity.seed),
            connection_config=ConnectionConfig(max_connections_per_peer=1),
            addrs_factory=lambda found: usable_addrs(found, lambda: self._listening, self.dialled_back_at),
        )
        _announce_circuits(self.host, lambda: self.circuit_addrs)
        self.relays = Relays(self, serve=relay_service)
        self.hole_punching = hole_punching
        self.gossipsub = GossipSub(
            protocols=[PROTOCOL_ID_V11, PROTOCOL_ID], degree=mesh_degree, degree_low=max(1, mesh_degree - 1),
            degree_high=mesh_degree + 2, heartbeat_interval=heartbeat_s, spam_protection_enabled=False,
        )
        # Addresses we could never dial are not even stored: the DHT, pubsub and reconnects all
        # dial from the peerstore, and each such dial waited on a router that dropped it.
        self.networks = local_networks()
        _store_dialable_only(self.host.get_peerstore(), lambda: self.networks)
        self.pubsub = _FramedPubsub(self.host, self.gossipsub, malformed=self.penalise)
        self.dht = BoundedKadDHT(self.host, limits=dht_limits, penalise=self.penalise,
                                 banned=lambda peer: peer in self.banned)
        # Peers that stopped answering (a network split leaves their connections open but silent)
        # are neither asked nor waited on until they answer a ping again.
        self.liveness = PeerLiveness(trio.current_time)
        guard_dht_requests(self.dht, self.liveness)
        self._nursery: trio.Nursery | None = None
        # Penalties are counted against the peer that delivered an invalid message (gossipsub
        # forwards only what its own validator accepted, so an invalid delivery is the
        # deliverer's fault); past the limit the peer is disconnected and ignored.
        self.max_rejects_per_peer = max_rejects_per_peer
        self.rejected: dict[str, int] = {}
        self.banned: set[str] = set()
        self.validator_errors = 0  # messages our own validator raised on (metrics: a bug of ours)
        self._validator_bugs_logged: set[tuple[str, str, str, int | None]] = set()

    # -- identity and peers ----------------------------------------------------------------
    @property
    def peer_id(self) -> str:
        return self.host.get_id().to_base58()

    @property
    def addrs(self) -> list[str]:
        return [str(a) for a in self.host.get_addrs()]

    @property
    def _listening(self) -> list[Multiaddr]:
        return list(self.host.get_transport_addrs())

    @property
    def listen_port(self) -> int:
        """The TCP port libp2p listens on."""
        return int(self._listening[0].value_for_protocol("tcp"))

    def connected_peers(self) -> list[str]:
        """Peers we hold a connection to that answer (not banned, not set aside as silent)."""
        return sorted(p for p in (p.to_base58() for p in self.host.get_connected_peers())
                      if p not in self.banned and self.liveness.usable(p))

    async def ping(self, peer_id: str) -> bool:
        """Whether ``peer_id`` answers a libp2p ping within UNANSWERED_AFTER_S."""
        with trio.move_on_after(UNANSWERED_AFTER_S):
            try:
                stream = await self.host.new_stream(ID.from_base58(peer_id), [PING_PROTOCOL])
                try:
                    await perform_ping_roundtrip(stream)
                finally:
                    await stream.close()
                return True
            except Exception as exc:
                log.debug("ping %s failed: %s", peer_id, exc)
        return False

    def peer_addrs(self, peer_id: str) -> list[str]:
        try:
            return [str(a) for a in self.host.get_peerstore().addrs(ID.from_base58(peer_id))]
        except Exception:
            return []

    async def connect(self, addr: str) -> str:
        """Dial a ``/ip4/…/tcp/…/p2p/<id>`` address; also seeds the DHT routing table with it."""
        try:
            info = info_from_p2p_addr(Multiaddr(addr))
            if info.peer_id.to_base58() in self.banned:
                raise NetworkError("peer is banned")
            with trio.fail_after(DIAL_TIMEOUT_S):
                await self.host.connect(info)
            await self.dht.add_peer(info.peer_id)
        except Exception as exc:
            raise NetworkError(f"cannot connect to {addr}: {exc}") from exc
        return info.peer_id.to_base58()

    async def discover(self, max_peers: int) -> list[str]:
        """More peers than the bootstrap ones, up to ``max_peers`` connections: :func:`.discovery.discover`."""
        return await discover(self, max_peers)

    # -- gossip ----------------------------------------------------------------------------
    def set_validator(self, topic: str, validator: GossipValidator | AsyncGossipValidator) -> None:
        """Install ``validator``; libp2p only knows accept/drop, so IGNORE drops without blame
        and REJECT drops and counts against the forwarding peer. A coroutine function (the fraud
        proofs', which awaits the referee's worker thread) is given the forwarding peer besides;
        py-libp2p runs it in the message's own task, at most 10 at once node-wide, and drops a
        message whose validation outlasts its ``validation_timeout`` (5 s) as it drops an IGNORE."""

        def passes(sender: str, outcome: Outcome) -> bool:
            if outcome is Outcome.REJECT and sender != self.peer_id:
                self.penalise(sender)
            return outcome is Outcome.ACCEPT

        def wrapped(forwarder: ID, msg) -> bool:
            sender = forwarder.to_base58()
            if sender in self.banned:
                return False
            author = ID(msg.from_id).to_base58() if msg.from_id else sender
            try:
                outcome = validator(author, bytes(msg.data))
            except Exception as exc:  # our bug, whatever the message: IGNORE, never a penalty
                self._validator_failed(topic, exc)
                return False
            return passes(sender, outcome)

        async def awaited(forwarder: ID, msg) -> bool:
            sender = forwarder.to_base58()
            if sender in self.banned:
                return False
            author = ID(msg.from_id).to_base58() if msg.from_id else sender
            try:
                outcome = await validator(sender, author, bytes(msg.data))
            except Exception as exc:  # our bug, as above
                self._validator_failed(topic, exc)
                return False
            return passes(sender, outcome)

        if inspect.iscoroutinefunction(validator):
            self.pubsub.set_topic_validator(topic, awaited, is_async_validator=True)
        else:
            self.pubsub.set_topic_validator(topic, wrapped, is_async_validator=False)

    def _validator_failed(self, topic: str, exc: Exception) -> None:
        """Count a raise of our own validator; its traceback is logged once per place it came from
        (a bug that fires on every message must not flood the log, nor hide a second bug)."""
        self.validator_errors += 1
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        where = (topic, type(exc).__name__, frame.filename, frame.lineno)
        if where not in self._validator_bugs_logged:
            self._validator_bugs_logged.add(where)
            log.error("BUG: our gossip validator for %s raised; the message is ignored and its sender not "
                      "penalised (this traceback is logged once)", topic, exc_info=exc)

    def penalise(self, peer_id: str) -> None:
        """Count one provably invalid message against ``peer_id``; ban it past the limit."""
        self.rejected[peer_id] = self.rejected.get(peer_id, 0) + 1
        if self.rejected[peer_id] >= self.max_rejects_per_peer and peer_id not in self.banned:
            log.warning("banning peer %s after %d invalid messages", peer_id, self.rejected[peer_id])
            self.banned.add(peer_id)
            if self._nursery is not None:
                self._nursery.start_soon(self._disconnect, peer_id)

    async def _disconnect(self, peer_id: str) -> None:
        try:
            await self.host.disconnect(ID.from_base58(peer_id))
        except Exception as exc:
            log.debug("disconnecting %s failed: %s", peer_id, exc)

    async def subscribe(self, topic: str, handler: GossipHandler) -> None:
        sub = await self.pubsub.subscribe(topic)
        assert self._nursery is not None
        self._nursery.start_soon(self._drain, topic, sub, handler)

    async def _drain(self, topic: str, sub, handler: GossipHandler) -> None:
        async for msg in sub:
            author = ID(msg.from_id).to_base58()
            try:
                await handler(author, bytes(msg.data))
            except Exception:
                log.exception("handler for topic %s failed", topic)

    async def publish(self, topic: str, data: bytes) -> None:
        if len(data) > MAX_PUBSUB_MESSAGE:
            raise NetworkError(f"message of {len(data)} bytes exceeds the gossip limit")
        with trio.move_on_after(PUBLISH_PACING_TIMEOUT_S):
            # a silent peer's queue never drains: waiting on it would hold every publish
            while any(len(q) >= PUBLISH_QUEUE_HIGH_WATER for p, q in self.pubsub.peer_queues.items()
                      if self.liveness.usable(p.to_base58())):
                await trio.sleep(0.01)
        await self.pubsub.publish(topic, data)
        await trio.sleep(0)  # publish() never yields; give the send loops a turn

    def topic_peers(self, topic: str) -> int:
        return len(self.pubsub.peer_topics.get(topic, ()))

    # -- DHT -------------------------------------------------------------------------------
    def register_record_validator(self, namespace: str, validator: RecordValidator) -> None:
        self.dht.register_validator(namespace, _SafeRecordValidator(validator))

    async def put_record(self, key: str, value: bytes) -> bool:
        """Store ``value`` under ``key``; False if a value we already hold is preferred to it."""
        try:
            with trio.fail_after(DHT_OP_TIMEOUT_S):
                await self.dht.put_value(key, value)
        except ValueError:  # a storing node's validator preferred the value it holds
            return False
        except Exception as exc:  # trio.TooSlowError included
            raise NetworkError(f"DHT put {key} failed: {exc!r}") from exc
        return True

    async def get_record(self, key: str, *, from_network: bool = False) -> bytes | None:
        """The record for ``key``. ``from_network`` asks the peers closest to the key and then
        selects over every answer *and* our own copy: storing nodes need not keep the preferred
        record (js-libp2p servers keep the last one written), so the reader arbitrates."""
        local = self.dht.value_store.get(key.encode()) if from_network else None
        if from_network:
            self.dht.value_store.remove(key.encode())  # get_value answers from local data when it has any
        found = None
        try:
            with trio.move_on_after(DHT_OP_TIMEOUT_S):
                found = await self.dht.get_value(key)
        except Exception as exc:
            log.debug("DHT get %s failed: %s", key, exc)
        if not from_network:
            return found
        arrived = self.dht.value_store.get(key.encode())  # get_value stored its pick; a PUT may have come in
        mine = [r.value for r in (local, arrived) if r is not None]
        answers = list(dict.fromkeys(v for v in (found, *mine) if v))
        if not answers:
            return None
        best = answers[self.dht.validator.select(key, answers)] if len(answers) > 1 else answers[0]
        self.dht.value_store.put(key.encode(), best)  # serve the preferred record to whoever asks us
        if found is not None and best != found:
            # the network answered with a record ours beats: store ours again at the closest peers
            # (a last-writer-wins server now holds it too), so later readers see it without us
            try:
                with trio.move_on_after(DHT_OP_TIMEOUT_S):
                    await self.dht.put_value(key, best)
            except Exception as exc:
                log.debug("DHT re-put %s failed: %s", key, exc)
        return best

    async def provide(self, key: str) -> bool:
        """Announce in the DHT that we hold the content under ``key`` (a hex multihash)."""
        try:
            with trio.move_on_after(DHT_OP_TIMEOUT_S):
                return await self.dht.provide(key)
        except Exception as exc:
            log.debug("DHT provide %s failed: %s", key, exc)
        return False

    async def find_providers(self, key: str, count: int = 20) -> list[str]:
        """Peers that announced ``key``, best effort; their addresses go into the peerstore."""
        infos = []
        try:
            with trio.move_on_after(DHT_OP_TIMEOUT_S):
                infos = await self.dht.find_providers(key, count)
        except Exception as exc:
            log.debug("DHT find_providers %s failed: %s", key, exc)
            return []
        me = self.peer_id
        found = []
        for info in infos:
            peer = info.peer_id.to_base58()
            if peer != me and peer not in found and peer not in self.banned:
                self.host.get_peerstore().add_addrs(info.peer_id, info.addrs, 3600)
                found.append(peer)
        return found

    # -- streams ---------------------------------------------------------------------------
    def set_stream_handler(self, protocol: str, handler: StreamHandler) -> None:
        async def wrapped(raw) -> None:
            stream = Stream(raw, raw.muxed_conn.peer_id.to_base58())
            if stream.peer_id in self.banned:  # it may dial us again after we dropped it
                await stream.reset()
                return
            try:
                await handler(stream)
            except Exception as exc:  # a bad peer must not crash the host
                log.info("stream %s from %s failed: %s", protocol, stream.peer_id, exc)
                await stream.reset()

        self.host.set_stream_handler(TProtocol(protocol), wrapped)

    async def open_stream(self, peer_id: str, protocol: str, *older: str) -> Stream:
        """A stream to ``peer_id`` of ``protocol``, or else of the first of ``older`` the peer
        speaks (one multistream negotiation); NetworkError at once if the peer is set aside as
        silent, and after UNANSWERED_AFTER_S (setting it aside) if opening one goes unanswered."""
        if not self.liveness.usable(peer_id):
            raise NetworkError(f"cannot open {protocol} to {peer_id}: the peer is not answering")
        if self.relays.kind(peer_id) == "none" and self.relays.circuits_to(peer_id):
            await self.relays.dial(peer_id)  # a node behind NAT: libp2p dials no circuit by itself
        with trio.move_on_after(UNANSWERED_AFTER_S):
            try:
                raw = await self.host.new_stream(ID.from_base58(peer_id), [TProtocol(p) for p in (protocol, *older)])
            except Exception as exc:
                raise NetworkError(f"cannot open {protocol} to {peer_id}: {exc}") from exc
            return Stream(raw, peer_id)
        self.liveness.unanswered(peer_id, f"opening {protocol}")
        raise NetworkError(f"cannot open {protocol} to {peer_id}: no answer in {UNANSWERED_AFTER_S:.0f} s")


def _announce_circuits(host, circuit_addrs: Callable[[], list[Multiaddr]]) -> None:
    """Make ``host.get_addrs()`` (what identify announces) end with our circuit addresses. Its own
    address pipeline cuts a circuit address at the relay's ``/p2p/`` part (it strips a peer ID
    before appending ours), so they are appended after it, whole."""
    addrs = host.get_addrs

    def with_circuits() -> list[Multiaddr]:
        me = Multiaddr(f"/p2p/{host.get_id()}")
        return addrs() + [a.encapsulate(me) for a in circuit_addrs()]

    host.get_addrs = with_circuits


def _store_dialable_only(peerstore, networks: Callable[[], Networks]) -> None:
    """Make ``peerstore`` drop the addresses that are not dialable from here (every other way
    into its address book goes through ``add_addrs``)."""
    add_addrs = peerstore.add_addrs

    def filtered(peer_id: ID, addrs, ttl: int = 0) -> None:
        add_addrs(peer_id, dialable_only(addrs, networks()), ttl)

    peerstore.add_addrs = filtered


def listener_inodes(node: P2P) -> set[int]:
    """The inodes of our libp2p listening sockets."""
    return {socket_inode(listener.socket.fileno()) for tcp in node.host.get_network().listeners.values()
            for listener in getattr(tcp, "listeners", ())}


def check_exclusive(node: P2P) -> None:
    """NetworkError, in one line, if another socket listens on our libp2p port (:mod:`.listen_port`)."""
    port = node.listen_port
    if strangers(port, listener_inodes(node)):
        raise NetworkError(f"libp2p port {port} is also bound by another process (with SO_REUSEPORT, which "
                           "splits our inbound connections with it): stop that process or choose another port")


def _check_listen(host: str, port: int) -> None:
    """Fail with the system's reason (a port in use, an address not of this machine) before
    py-libp2p tries, which only logs it."""
    if port == 0:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise NetworkError(f"cannot listen on {host}:{port} for libp2p: {exc.strerror}") from None


@asynccontextmanager
async def open_p2p(identity: Identity, host: str, port: int, **kwargs) -> AsyncIterator[P2P]:
    """Run a libp2p node listening on ``host:port`` for the duration of the block."""
    node = P2P(identity, **kwargs)
    # The deadline scope must enclose everything it may cancel, so it is opened first and
    # armed only at shutdown (opening a fail_after at shutdown corrupts trio's scope stack).
    # Our tasks' nursery is entered last, so it closes first: cancelling it while libp2p's services
    # still had to exit made their exits raise Cancelled, which replaced (and so swallowed) any
    # exception leaving the block.
    with trio.CancelScope(deadline=math.inf) as shutdown:
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(background_trio_service(node.pubsub))
            await stack.enter_async_context(background_trio_service(node.gossipsub))
            _check_listen(host, port)
            await stack.enter_async_context(node.host.run(listen_addrs=[Multiaddr(f"/ip4/{host}/tcp/{port}")]))
            if not node.host.get_addrs():  # py-libp2p logs a failed listen and runs on without one
                raise NetworkError(f"cannot listen on {host}:{port} for libp2p (taken meanwhile?)")
            check_exclusive(node)
            await stack.enter_async_context(background_trio_service(node.dht))
            await stack.enter_async_context(background_trio_service(node.relays.protocol))
            if node.hole_punching:
                await stack.enter_async_context(background_trio_service(node.relays.hole_punch))
            await node.pubsub.wait_until_ready()
            try:
                async with trio.open_nursery() as nursery:
                    node._nursery = nursery
                    nursery.start_soon(probe_forever, node.liveness, node.ping)
                    nursery.start_soon(node.relays.keep_reservations, nursery)
                    try:
                        yield node
                    finally:
                        nursery.cancel_scope.cancel()
            finally:
                shutdown.deadline = trio.current_time() + 10


def usable_addrs(candidates: list[Multiaddr], listening: Callable[[], list[Multiaddr]],
                 dialled_back_at: set[str]) -> list[Multiaddr]:
    """The addresses a node announces, only ones a peer can dial: an unspecified listen address
    (0.0.0.0) becomes this machine's interface addresses; an address peers merely observed us
    at (identify) only once a dial-back reached our listener there — behind NAT the observed
    port is the router's mapping, which nobody else can use. ``listening`` is read only when an
    address needs it (the host asks for its addresses while it is being built)."""
    out: list[Multiaddr] = []
    for addr in candidates:
        try:
            host, found_port = addr.value_for_protocol("ip4"), addr.value_for_protocol("tcp")
        except Exception:  # not TCP over IPv4: announced as libp2p found it
            out.append(addr)
            continue
        if host == "0.0.0.0":
            out += [Multiaddr(f"/ip4/{ip}/tcp/{found_port}") for ip in interface_ipv4s()]
        elif addr in listening():
            out.append(addr)
        elif host in dialled_back_at:
            out.append(Multiaddr(f"/ip4/{host}/tcp/{listening()[0].value_for_protocol('tcp')}"))
    return list(dict.fromkeys(out)) or candidates
