"""The sync stream protocol ``/open1b/sync/1.1.0`` (and ``1.0.0``): pull a peer's attestations
(and witness reveals, spot checks and fraud proofs) of one run.

Frames are varint-length-prefixed. Request: one frame, canonical CBOR ``{"run": <32 bytes>}``
(≤ 256 bytes). Response: up to :data:`MAX_SYNC_STATEMENTS` frames, each one encoded attestation,
witness reveal or spot check (≤ MAX_ATTESTATION_SIZE) or fraud proof (≤ MAX_GOSSIP_FRAUD_PROOF, at
most :data:`MAX_SYNC_FRAUD_PROOFS` of them; on ``1.1.0`` a larger one as its reference, whose body
the puller fetches from this peer, node/fraud_proof_fetch.py), then an empty frame. The puller validates every frame exactly like a
gossiped one, so a lying peer can waste our time but never put anything unchecked in the store.

The two versions differ only in references (docs/protocol.md §11.1, r25): a node of r22 or
earlier speaks ``1.0.0`` and reads a reference as a malformed attestation, held against the
server; so a server answers ``1.0.0`` without them, and a puller asks for ``1.1.0`` first, then
``1.0.0`` (one negotiation), and takes a reference on either (nodes of r23 and r24 send them on
``1.0.0``).

A second protocol, ``/open1b/sync/runs/1.0.0`` (below), lets a node learn the run manifests it
missed on the runs topic (docs/protocol.md §11.3).

:class:`Syncer` is the node's side of both: bootstrap, then a sync round with a random peer
every ``sync_interval_s``.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import random
from typing import Awaitable, Callable

import trio

from open1b.protocol import SignedMessage
from open1b.protocol.codec import decode, encode
from open1b.protocol.errors import ProtocolError, WrongTypeError
from open1b.protocol.messages import MAX_ATTESTATION_SIZE, MAX_MANIFEST_SIZE

from .clock import Clock
from .config import MIN_SYNC_INTERVAL_S, NodeConfig
from .fraud_proofs import MAX_GOSSIP_FRAUD_PROOF
from .metrics import NodeStats
from .p2p import P2P, NetworkError, Stream
from .statements import Statements

log = logging.getLogger("open1b.node.sync")

SYNC_PROTOCOL = "/open1b/sync/1.1.0"
SYNC_PROTOCOL_R22 = "/open1b/sync/1.0.0"
"""The version without fraud proof references, for nodes of r22 and earlier (module doc)."""
MAX_SYNC_REQUEST = 256
MAX_SYNC_STATEMENTS = 100_000
SYNC_BATCH = 1024  # frames per ingest call (one store transaction each)
MAX_SYNC_FRAUD_PROOFS = 64
"""Frames over MAX_ATTESTATION_SIZE (fraud proofs, up to MAX_GOSSIP_FRAUD_PROOF bytes) in one
response: a node stores one proof per (step, guilty key), so an honest peer holds few; each is
ingested on arrival, so at most one large frame is held at a time."""
SYNC_TIMEOUT_S = 10.0
MAX_DIALLED_PEERS = 32
DISCOVERY_EVERY_SYNC_ROUNDS = 10
BOOTSTRAP_FIRST_RETRY_S, BOOTSTRAP_MAX_RETRY_S = 0.2, 10.0


async def serve_sync(stream: Stream, attestations_of: Callable[[bytes], list[SignedMessage] | None],
                     allow: Callable[[str, bytes], bool] = lambda peer, run: True) -> None:
    """Answer one request; one that ``allow(peer, run)`` refuses is reset unanswered."""
    request = decode(await stream.receive(MAX_SYNC_REQUEST), max_size=MAX_SYNC_REQUEST)
    if type(request) is not dict or set(request) != {"run"} or type(request["run"]) is not bytes:
        raise WrongTypeError("malformed sync request")
    if not allow(stream.peer_id, request["run"]):
        await stream.reset()
        return
    for att in (attestations_of(request["run"]) or [])[:MAX_SYNC_STATEMENTS]:
        await stream.send(att.encoded)
    await stream.send(b"")
    await stream.close()


async def pull_attestations(p2p: P2P, peer_id: str, run: bytes,
                            ingest: Callable[[list[bytes]], Awaitable[int]]) -> int:
    """Ask ``peer_id`` for its statements of ``run``; returns how many ``ingest`` found new. A frame
    may hold either kind (a reveal is smaller than MAX_ATTESTATION_SIZE): ``ingest`` tells them apart.
    Frames are handed over SYNC_BATCH at a time, so that ingest stores each batch in one
    transaction while memory stays bounded."""
    stream = await p2p.open_stream(peer_id, SYNC_PROTOCOL, SYNC_PROTOCOL_R22)
    frames: list[bytes] = []
    new = 0
    try:
        await stream.send(encode({"run": run}))
        large = 0
        for _ in range(MAX_SYNC_STATEMENTS):
            frame = await stream.receive(MAX_GOSSIP_FRAUD_PROOF)
            if not frame:
                break
            if len(frame) > MAX_ATTESTATION_SIZE:  # only a fraud proof is larger: handed over at once
                large += 1
                if large > MAX_SYNC_FRAUD_PROOFS:
                    raise WrongTypeError(f"more than {MAX_SYNC_FRAUD_PROOFS} frames over {MAX_ATTESTATION_SIZE} bytes")
                new += await ingest([frame])
                continue
            frames.append(frame)
            if len(frames) == SYNC_BATCH:
                new += await ingest(frames)
                frames = []
    finally:
        await stream.close()
    return new + await ingest(frames)


# -- manifests ---------------------------------------------------------------------------------
# ``/open1b/sync/runs/1.0.0``: a late joiner (or a node back from a restart or a partition) learns
# the runs it missed on the runs topic. On one stream: the puller sends ``{"runs": true}``; the
# server answers one frame, the canonical CBOR list of the run ids it knows (≤ MAX_SYNC_RUNS);
# the puller sends ``{"want": [ids]}`` (≤ MAX_SYNC_WANT of them, each from that list); the server
# answers one frame per wanted id, in order: the encoded manifest, or an empty frame if it has
# none. Every manifest is validated exactly like a gossiped one.

RUNS_SYNC_PROTOCOL = "/open1b/sync/runs/1.0.0"
MAX_SYNC_RUNS = 1024
MAX_SYNC_WANT = 16
MAX_RUNS_REQUEST = 64 + MAX_SYNC_WANT * 34
MAX_RUN_LIST = 16 + MAX_SYNC_RUNS * 34


async def serve_runs(stream: Stream, run_ids: Callable[[], list[bytes]],
                     manifest_of: Callable[[bytes], bytes | None],
                     allow: Callable[[str, bytes], bool] = lambda peer, run: True) -> None:
    request = decode(await stream.receive(MAX_RUNS_REQUEST), max_size=MAX_RUNS_REQUEST)
    if request != {"runs": True}:
        raise WrongTypeError("malformed runs sync request")
    if not allow(stream.peer_id, b""):
        await stream.reset()
        return
    known = run_ids()[:MAX_SYNC_RUNS]
    await stream.send(encode(known))
    request = decode(await stream.receive(MAX_RUNS_REQUEST), max_size=MAX_RUNS_REQUEST)
    if (type(request) is not dict or set(request) != {"want"} or type(request["want"]) is not list
            or len(request["want"]) > MAX_SYNC_WANT or not all(type(r) is bytes for r in request["want"])):
        raise WrongTypeError("malformed runs sync request")
    for run in request["want"]:
        await stream.send(manifest_of(run) or b"")
    await stream.close()


async def pull_manifests(p2p: P2P, peer_id: str, known: Callable[[bytes], bool],
                         ingest: Callable[[bytes], Awaitable[bool]]) -> int:
    """Ask ``peer_id`` for the runs it knows and fetch up to :data:`MAX_SYNC_WANT` manifests we
    lack; returns how many ``ingest`` found new. A malformed answer raises :class:`WrongTypeError`."""
    stream = await p2p.open_stream(peer_id, RUNS_SYNC_PROTOCOL)
    new = 0
    try:
        await stream.send(encode({"runs": True}))
        listed = decode(await stream.receive(MAX_RUN_LIST), max_size=MAX_RUN_LIST)
        if type(listed) is not list or len(listed) > MAX_SYNC_RUNS or not all(
                type(r) is bytes and len(r) == 32 for r in listed):
            raise WrongTypeError("malformed run list")
        want = [r for r in dict.fromkeys(listed) if not known(r)][:MAX_SYNC_WANT]
        await stream.send(encode({"want": want}))
        for _ in want:
            frame = await stream.receive(MAX_MANIFEST_SIZE)
            if frame:
                new += await ingest(frame)
    finally:
        await stream.close()
    return new


# -- the node's side: bootstrap, then periodic sync rounds ---------------------------------------
class Syncer:
    """Pulls what peers hold, so statements missed on gossip (late joiners, restarts, mesh churn)
    still arrive; answers the same requests from peers. Built with all it needs; the stream
    handlers are in place from construction, before the node's API says it is ready."""

    def __init__(self, p2p: P2P, statements: Statements, config: NodeConfig, *, clock: Clock, rng: random.Random,
                 stats: NodeStats) -> None:
        self.p2p, self.statements, self.config, self.clock, self.rng = p2p, statements, config, clock, rng
        self.stats = stats
        self.bootstrapped = trio.Event()  # set once bootstrap has pulled what the first peers knew
        self._served: dict[tuple[str, bytes], float] = {}  # (peer, run; b"": the run list) -> when served
        known = statements.manifests
        p2p.set_stream_handler(SYNC_PROTOCOL, lambda stream: serve_sync(stream, statements.statements_for_sync,
                                                                         self._may_serve))
        p2p.set_stream_handler(SYNC_PROTOCOL_R22, lambda stream: serve_sync(
            stream, functools.partial(statements.statements_for_sync, refs=False), self._may_serve))
        p2p.set_stream_handler(RUNS_SYNC_PROTOCOL, lambda stream: serve_runs(
            stream, lambda: list(known), lambda run: m.encoded if (m := known.get(run)) else None, self._may_serve))

    def _may_serve(self, peer: str, run: bytes) -> bool:
        """At most one answer per peer and run (or run list) every MIN_SYNC_INTERVAL_S: a peer that
        syncs with no pause (interval 0 cost us 25 % of a core) gets resets in between. Not a
        reject: an honest peer's bootstrap and its first round may ask twice in a moment."""
        now = self.clock.now()
        if now - self._served.get((peer, run), -math.inf) < MIN_SYNC_INTERVAL_S:
            return False
        if len(self._served) > 16384:
            self._served = {k: t for k, t in self._served.items() if now - t < MIN_SYNC_INTERVAL_S}
        self._served[(peer, run)] = now
        return True

    async def sync_with(self, peer_id: str) -> int:
        """Pull ``peer_id``'s runs, then its statements of every run we know; how many were new."""
        new = 0
        try:
            with trio.fail_after(SYNC_TIMEOUT_S):
                new += await pull_manifests(self.p2p, peer_id, lambda run: run in self.statements.manifests,
                                            lambda data: self.statements.ingest_manifest(data, source=peer_id))
        except ProtocolError as exc:  # a malformed answer: provably the peer's fault
            log.info("runs sync with %s: %s", peer_id, exc)
            self.statements.validation[f"sync/reject/{exc.code}"] += 1
            self.p2p.penalise(peer_id)
        except (NetworkError, trio.TooSlowError) as exc:  # the peer's failure, never ours to die of
            log.info("runs sync with %s failed: %s", peer_id, exc)
        for run in list(self.statements.manifests):
            try:
                with trio.fail_after(SYNC_TIMEOUT_S):
                    new += await pull_attestations(self.p2p, peer_id, run,
                                                   lambda frames: self.statements.ingest_synced(frames, source=peer_id))
            except (NetworkError, trio.TooSlowError) as exc:
                log.info("sync of run %s with %s failed: %s", run.hex()[:12], peer_id, exc)
        self.stats.synced += new
        return new

    async def bootstrap(self) -> None:
        """Dial the bootstrap peers (retrying with backoff until one answers), discover more
        peers through the DHT, and pull what they already know — before auditing anything, so
        a node that starts late does not redo finished work or miss live claims."""
        bootstrap = self.config.bootstrap
        pending = list(bootstrap)
        delay = BOOTSTRAP_FIRST_RETRY_S
        # Until a bootstrap peer answers or some other peer has dialled us: a node whose only
        # bootstrap peer crashed must not wait for it while its other peers carry on.
        while pending and len(pending) == len(bootstrap) and not self.p2p.connected_peers():
            for addr in list(pending):
                try:
                    await self.p2p.connect(addr)
                    pending.remove(addr)
                except NetworkError as exc:
                    log.info("bootstrap: %s", exc)
            if len(pending) == len(bootstrap):
                await self.clock.sleep(delay)
                delay = min(delay * 2, BOOTSTRAP_MAX_RETRY_S)
        dialled = await self.p2p.discover(MAX_DIALLED_PEERS)
        log.info("bootstrapped: %d peers connected (%d discovered)", len(self.p2p.connected_peers()), len(dialled))
        for peer in self.p2p.connected_peers():
            await self.sync_with(peer)
        self.bootstrapped.set()

    async def serve_syncer(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Bootstrap, and every ``sync_interval_s`` sync with one connected peer, chosen at random;
        every few rounds, discover more peers."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.bootstrap)  # rounds start meanwhile: peers that dial us are synced too
            task_status.started()
            for rounds in itertools.count(1):
                await self.clock.sleep(self.config.sync_interval_s)
                if rounds % DISCOVERY_EVERY_SYNC_ROUNDS == 0:
                    await self.p2p.discover(MAX_DIALLED_PEERS)
                peers = self.p2p.connected_peers()
                if peers:
                    await self.sync_with(self.rng.choice(peers))
