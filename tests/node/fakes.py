"""Test doubles for the network side of a node's components, and a builder for its ledger
(:func:`open1b.node.ledger.build_ledger`)."""

from __future__ import annotations

import inspect
import logging
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator

import trio

from open1b.node.clock import Clock
from open1b.node.config import NodeConfig
from open1b.node.ledger import Ledger, build_ledger
from open1b.node.metrics import NodeStats
from open1b.node.p2p import NetworkError
from open1b.node.store import Store
from open1b.protocol import Claim, Identity, Outcome, RunManifest, peer_id_from_public_key, select_claim
from open1b.protocol.hashing import blake2b256
from tests.runs import run_manifest


class FakeGossip:
    """Records what a component publishes and whom it penalises; subscribes to nothing."""

    def __init__(self) -> None:
        self.published: list[tuple[str, bytes]] = []
        self.penalised: list[str] = []
        self.validators: dict[str, object] = {}

    def set_validator(self, topic, validator) -> None:
        self.validators[topic] = validator

    async def subscribe(self, topic, handler) -> None:
        pass

    async def publish(self, topic: str, data: bytes) -> None:
        self.published.append((topic, data))

    def penalise(self, peer_id: str) -> None:
        self.penalised.append(peer_id)


class FakeP2P(FakeGossip):
    """The auditor's network side: gossip, plus DHT provider records (kept, never sent)."""

    def __init__(self) -> None:
        super().__init__()
        self.provided: list[str] = []

    async def provide(self, key: str) -> bool:
        self.provided.append(key)
        return True


class FakeClaimBoard:
    """An in-memory DHT with its semantics: every write reaches one shared record store that keeps
    what ``select_claim`` prefers."""

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


class FakeStream:
    """One side of an in-memory stream: frames as ``p2p.Stream`` carries them, each bounded on
    receipt; a closed or reset peer is a :class:`NetworkError`, as on libp2p."""

    remote_host = None  # in memory: no address a dial-back could reach (node/reachability.py)
    relayed = False  # in memory: every stream is direct (node/relays.py)

    def __init__(self, peer_id: str, send: trio.MemorySendChannel, receive: trio.MemoryReceiveChannel) -> None:
        self.peer_id, self._send, self._receive = peer_id, send, receive

    async def send(self, frame: bytes) -> None:
        try:
            await self._send.send(bytes(frame))
        except (trio.ClosedResourceError, trio.BrokenResourceError) as exc:
            raise NetworkError(f"send to {self.peer_id} failed: {exc!r}") from exc

    async def receive(self, max_size: int) -> bytes:
        try:
            frame = await self._receive.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError, trio.BrokenResourceError) as exc:
            raise NetworkError(f"receive from {self.peer_id} failed: {exc!r}") from exc
        if len(frame) > max_size:
            raise NetworkError(f"frame of {len(frame)} bytes from {self.peer_id} over {max_size}")
        return frame

    async def close(self) -> None:
        await self._send.aclose()  # a half-close: what the peer sent can still be read

    async def reset(self) -> None:
        await self._send.aclose()
        await self._receive.aclose()


class FakeNetwork:
    """An in-memory network that whole daemons join (``open_daemon(…, network=net.open_node)``): one
    gossip fabric that runs each receiver's validators, one DHT (records under each namespace's
    record rule, provider records), and streams between connected nodes. Peer IDs are the nodes'
    keys' (``peer_id_from_public_key``), as on libp2p. Nodes hand out no transport addresses
    (``peer_addrs`` is empty), so the bulk path (TCP beside libp2p) is never dialled, and a
    provider refuses to dial back (its streams have no remote address): checkpoints travel on the
    blob stream."""

    def __init__(self) -> None:
        self.nodes: dict[str, FakeNode] = {}
        self.records: dict[str, bytes] = {}  # the DHT's records, as every storing node would hold them
        self.record_rules: dict[str, object] = {}  # namespace -> RecordValidator
        self.providers: dict[str, list[str]] = {}
        self.published: list[tuple[str, str, bytes]] = []  # (author peer ID, topic, data), every publish

    @asynccontextmanager
    async def open_node(self, identity: Identity, host: str, port: int, **_: object) -> AsyncIterator[FakeNode]:
        """``open_p2p``'s signature: a node on this network for the duration of the block."""
        node = FakeNode(self, identity, len(self.nodes) + 1)
        self.nodes[node.peer_id] = node
        try:
            async with trio.open_nursery() as nursery:
                node._nursery = nursery
                try:
                    yield node
                finally:
                    nursery.cancel_scope.cancel()
        finally:
            del self.nodes[node.peer_id]
            for other in self.nodes.values():
                other.connected.discard(node.peer_id)

    def put(self, key: str, value: bytes) -> bool:
        """A DHT write under the namespace's rule: invalid records refused, the preferred one kept."""
        rule = self.record_rules.get(key.split("/")[1])
        if rule is None:
            raise NetworkError(f"no record rule for {key}")
        try:
            rule.validate(key, value)
        except Exception as exc:
            raise NetworkError(f"DHT put {key} refused: {exc!r}") from exc
        old = self.records.get(key)
        if old is not None and old != value and rule.select(key, [old, value]) == 0:
            return False
        self.records[key] = value
        return True


class FakeDhtMode:
    """The DHT's mode, as node/reachability.py's verdict sets it (``BoundedKadDHT.serve_as``)."""

    client = False

    async def serve_as(self, *, client: bool) -> bool:
        changed, self.client = client != self.client, client
        return changed


class FakeRelays:
    """``P2P.relays`` on an in-memory network: every connection direct, no relay anywhere."""

    def __init__(self, node: FakeNode) -> None:
        self.node = node

    def kind(self, peer: str) -> str:
        return "direct" if peer in self.node.connected else "none"

    def status(self) -> dict:
        peers = {p: "direct" for p in self.node.connected_peers()}
        return {"connections": {"direct": len(peers), "relayed": 0}, "peers": peers, "relay_service": False,
                "relay_requests_refused": 0, "relay_reservations_refused_full": 0, "relay_reservations_served": 0,
                "reserved_on": [], "circuits_dialled": 0, "circuit_dials_failed": 0,
                "hole_punches": {"attempts": 0, "succeeded": 0, "answered": 0}}


class FakeNode:
    """A daemon's P2P on a :class:`FakeNetwork`: the surface of ``node/p2p.py``'s ``P2P`` it uses."""

    def __init__(self, network: FakeNetwork, identity: Identity, number: int) -> None:
        self.network, self.identity = network, identity
        self.peer_id = peer_id_from_public_key(identity.public_key)
        self.addrs = [f"/ip4/10.0.0.{number}/tcp/4701/p2p/{self.peer_id}"]
        self.listen_port = 4701
        self.dialled_back_at: set[str] = set()  # node/reachability.py's verdict writes it
        self.reachability = "unknown"  # and this
        self.connected: set[str] = set()
        self.banned: set[str] = set()
        self.rejected: dict[str, int] = {}
        self.validator_errors = 0
        self.max_rejects_per_peer = 20
        self.validators: dict[str, object] = {}
        self.async_validators: dict[str, object] = {}  # validated in the message's own task, as libp2p does
        self.handlers: dict[str, object] = {}  # topic -> gossip handler
        self.stream_handlers: dict[str, object] = {}
        self.provided: list[str] = []
        self._nursery: trio.Nursery | None = None
        self.relays = FakeRelays(self)
        self.dht = FakeDhtMode()

    # -- peers ---------------------------------------------------------------------------------
    def connected_peers(self) -> list[str]:
        return sorted(p for p in self.connected if p not in self.banned)

    def peer_addrs(self, peer_id: str) -> list[str]:
        return []

    async def connect(self, addr: str) -> str:
        peer = addr.rsplit("/p2p/", 1)[-1]
        other = self.network.nodes.get(peer)
        if other is None or peer in self.banned:
            raise NetworkError(f"cannot connect to {addr}")
        self.connected.add(peer)
        other.connected.add(self.peer_id)
        await trio.sleep(0)
        return peer

    async def discover(self, max_peers: int) -> list[str]:
        await trio.sleep(0)
        return []

    def penalise(self, peer_id: str) -> None:
        self.rejected[peer_id] = self.rejected.get(peer_id, 0) + 1
        if self.rejected[peer_id] >= self.max_rejects_per_peer:
            self.banned.add(peer_id)

    # -- gossip: delivered to every subscribed node connected to the author, and to the author itself
    #    (libp2p's pubsub does too), each through the receiver's own validator ----------------------
    def set_validator(self, topic: str, validator) -> None:
        if inspect.iscoroutinefunction(validator):  # given the forwarder besides, as node/p2p.py's
            self.async_validators[topic] = validator
        else:
            self.validators[topic] = validator

    async def subscribe(self, topic: str, handler) -> None:
        self.handlers[topic] = handler

    def topic_peers(self, topic: str) -> int:
        return sum(1 for p in self.connected if topic in self.network.nodes[p].handlers)

    async def publish(self, topic: str, data: bytes) -> None:
        self.network.published.append((self.peer_id, topic, bytes(data)))
        for receiver in [self] + [self.network.nodes[p] for p in self.connected_peers() if p in self.network.nodes]:
            receiver._deliver(self.peer_id, topic, bytes(data))
        await trio.sleep(0)

    def _deliver(self, author: str, topic: str, data: bytes) -> None:
        handler = self.handlers.get(topic)
        if handler is None or author in self.banned:
            return
        assert self._nursery is not None
        if topic in self.async_validators:
            self._nursery.start_soon(self._validate_then_handle, author, topic, data)
            return
        validator = self.validators.get(topic)
        if validator is not None:
            try:
                outcome = validator(author, data)
            except Exception:
                self._validator_raised(topic)
                return
            if not self._passes(author, outcome):
                return
        self._nursery.start_soon(handler, author, data)

    async def _validate_then_handle(self, author: str, topic: str, data: bytes) -> None:
        try:
            outcome = await self.async_validators[topic](author, author, data)  # the author delivers its own
        except Exception:
            self._validator_raised(topic)
            return
        if self._passes(author, outcome):
            await self.handlers[topic](author, data)

    def _validator_raised(self, topic: str) -> None:  # our bug: ignored, nobody penalised (p2p.py)
        self.validator_errors += 1
        logging.getLogger("tests.fake_network").exception("validator for %s raised", topic)

    def _passes(self, author: str, outcome: Outcome) -> bool:
        if outcome is Outcome.REJECT and author != self.peer_id:
            self.penalise(author)
        return outcome is Outcome.ACCEPT

    # -- DHT -------------------------------------------------------------------------------------
    def register_record_validator(self, namespace: str, validator) -> None:
        self.network.record_rules[namespace] = validator

    async def put_record(self, key: str, value: bytes) -> bool:
        await trio.sleep(0)
        return self.network.put(key, value)

    async def get_record(self, key: str, *, from_network: bool = False) -> bytes | None:
        await trio.sleep(0)
        return self.network.records.get(key)

    async def provide(self, key: str) -> bool:
        await trio.sleep(0)
        self.provided.append(key)
        holders = self.network.providers.setdefault(key, [])
        if self.peer_id not in holders:
            holders.append(self.peer_id)
        return True

    async def find_providers(self, key: str, count: int = 20) -> list[str]:
        await trio.sleep(0)
        return [p for p in self.network.providers.get(key, []) if p != self.peer_id and p not in self.banned][:count]

    # -- streams ---------------------------------------------------------------------------------
    def set_stream_handler(self, protocol: str, handler) -> None:
        self.stream_handlers[protocol] = handler

    async def open_stream(self, peer_id: str, protocol: str, *older: str) -> FakeStream:
        """As P2P's: the first of ``protocol`` and ``older`` that the peer handles."""
        other = self.network.nodes.get(peer_id)
        spoken = [p for p in (protocol, *older) if other is not None and p in other.stream_handlers]
        if not spoken or peer_id in self.banned:
            raise NetworkError(f"cannot open {protocol} to {peer_id}")
        protocol = spoken[0]
        to_them, at_them = trio.open_memory_channel(64)
        to_us, at_us = trio.open_memory_channel(64)
        theirs = FakeStream(self.peer_id, to_us, at_them)
        assert other._nursery is not None
        other._nursery.start_soon(other._serve_stream, protocol, theirs)
        await trio.sleep(0)
        return FakeStream(peer_id, to_them, at_us)

    async def _serve_stream(self, protocol: str, stream: FakeStream) -> None:
        try:
            await self.stream_handlers[protocol](stream)
        except Exception as exc:  # a bad peer must not crash the host (p2p.py)
            logging.getLogger("tests.fake_network").info("stream %s from %s failed: %s", protocol, stream.peer_id, exc)
            await stream.reset()


def auditable_manifest(publisher: Identity, steps: int, created_at: int) -> RunManifest:
    """A manifest this node's engine would replay (its model is a real preset's), with made-up
    state hashes: for tests whose replays are scripted, not computed."""
    from open1b.deterministic.trainer import DEFAULT_PRESET, run_fields  # numba: only for the tests that need it

    fields = run_fields(DEFAULT_PRESET, 0, {})
    return run_manifest(publisher, **fields, steps=steps, created_at=created_at,
                        state_hashes=[blake2b256(b"tests/state", bytes([k])) for k in range(steps + 1)])


class FrozenClock(Clock):
    """Wall time fixed at ``wall_s`` (usable outside trio); trio's clock as usual."""

    def __init__(self, wall_s: int | None = None) -> None:
        super().__init__()
        self.wall_s = int(time.time()) if wall_s is None else wall_s

    def wall_ms(self) -> int:
        return self.wall_s * 1000


def make_ledger(directory: Path, *manifests: RunManifest, identity: Identity | None = None,
                clock: Clock | None = None, gossip: FakeGossip | None = None, **config) -> Ledger:
    """A node's ledger (statements, judge, counting, planner view, replay proof, outbox) over a
    fresh store in ``directory`` that knows ``manifests``, wired as the daemon wires it."""
    directory.mkdir(parents=True, exist_ok=True)
    clock = clock or Clock()
    store = Store(directory / "store.sqlite", now_ms=clock.wall_ms)
    for m in manifests:
        store.add_manifest(m)
    return build_ledger(identity or Identity(b"\x07" * 32), NodeConfig(data_dir=directory, **config), store,
                        gossip or FakeGossip(), clock=clock, stats=NodeStats())
