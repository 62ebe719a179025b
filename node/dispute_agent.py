"""The daemon's disputes (docs/protocol.md §18.5, "When a node disputes"): it opens a dispute when
its own computation of a step and a party's signed result differ, and answers the disputes others
open over a step it published or attested.

* **Opening.** Every stored attestation is told to :class:`DisputeInbox` (a ledger listener,
  bounded: one full is dropped, with a log line). For an attestation of step k of a known run, the
  parties this node disputes, once each per (run, step, party):
  - our own attestation whose post-state is not the published h_{k+1}: the run's publisher, and
    each counted key whose attestation of step k has another post-state than ours;
  - another counted key's attestation whose post-state differs from ours, where ours is the
    published h_{k+1} of a run this node published (it holds the run's files), or the post-state
    of our own attestation of step k.
  Never a key the node does not count (its statements do not bear on coverage; anyone can mint
  keys), nor a party a stored proof already convicts at that step.
* **Answering** (:class:`~.disputes.DisputeServer`): for a step of a run it published (it holds
  checkpoint k and the samples) or attested (fetched again, as for a replay); else ``no_trace``.
  Only a dispute it would have opened itself (:meth:`DisputeAgent.refusal`): from the publisher
  when our h_{k+1} is not the published one, or from a counted key whose attestation of step k
  differs from ours, once per (run, step, key); else ``not_disputed``, before any replay (keys
  are free: any key could otherwise buy a traced replay per step). An opener retries that one
  as ``busy`` (our attestation may not have reached the peer yet).
* **Bounds** (a trace is a full replay of the step, in the worker): at most ``max_open`` disputes
  opened at once and :data:`MAX_PENDING` waiting; one dispute with a peer at a time, either way
  (busy, unreachable, or our trace failed: :data:`BUSY_TRIES` tries, a random 2–8 s apart); 4
  answered at once (a newcomer takes the slot of a peer behind its pace, :mod:`.disputes`); each
  peer's time bounded (:mod:`.dispute_exchange`, r28); a peer's next dispute answered no sooner than its last answer took (one peer
  gets at most half the worker); the last :data:`TRACES_KEPT` traces kept (no replay again).
* **Results.** A proof the referee accepts and the gossip rules admit (node/fraud_proofs.py: up
  to the referee's bound, a key that vouched for the step and counts here) is stored and gossiped
  through the outbox, whichever side found it (over the gossip bound, as a reference whose body
  peers fetch, node/fraud_proof_refs.py); coverage counts it (§8.3). The referee runs on it once,
  in the bisection that built it (in a worker thread), and its verdict is carried to the store
  (:meth:`.referee_worker.RefereeWorker.carry`: up to seconds a proof at ``gpt-1b``, not twice).
  A peer at fault in a malformed way is penalised (in :mod:`.disputes`); a silent one loses on
  this node (``peer_silent``: counted in ``status.disputes``, proves nothing to others).
"""

from __future__ import annotations

import logging
import random
from collections import OrderedDict
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from pathlib import Path
from typing import AsyncIterator, Awaitable, Callable, Mapping

import trio

from open1b.protocol import Attestation, Identity, Outcome, RunManifest
from open1b.protocol.dispute.bisection import DISPUTE_PROTOCOL
from open1b.protocol.dispute.trace import TraceCommitment, trace_tree
from open1b.protocol.identity import peer_id_from_public_key, public_key_from_peer_id

from .blobs import provider_key
from .clock import Clock
from .counting import Counting
from .dispute_exchange import Timing
from .dispute_tracer import StepTrace, Tracer
from .disputes import DisputeResult, DisputeServer, Party, bisect
from .fetcher import Fetcher
from .fraud_proofs import ProvenFraud
from .metrics import NodeStats
from .p2p import P2P, NetworkError, Stream
from .referee_worker import RefereeWorker
from .runs import FIND_PROVIDERS_TIMEOUT_S, RunFilesError, samples_blob
from .store import Store
from .worker import ReplayFailed

log = logging.getLogger("open1b.node.disputes")

INBOX_SIZE, MAX_PENDING = 256, 64  # attestations waiting to be looked at; disputes waiting to be opened
BUSY_TRIES, BUSY_RETRY_S, TRACES_KEPT = 3, (2.0, 8.0), 2
SETTLED = frozenset({"proof", "agree", "records_differ", "ops_differ"})  # outcomes that end a disagreement
# Refusals worth another try: the peer's bounds, or our attestation has not reached it yet (gossip).
RETRIED = frozenset({"busy", "not_disputed"})


class DisputeInbox:
    """The ledger's listener: stored attestations, queued for the agent (module doc)."""

    def __init__(self, size: int = INBOX_SIZE) -> None:
        self.send, self.receive = trio.open_memory_channel[Attestation](size)

    def stored(self, statement) -> None:
        if isinstance(statement, Attestation):
            try:
                self.send.send_nowait(statement)
            except trio.WouldBlock:
                log.warning("dispute inbox full: attestation of step %d not checked for a dispute", statement.step)


class DisputeAgent:
    def __init__(self, identity: Identity, p2p: P2P, tracer: Tracer, inbox: DisputeInbox, *,
                 runs: Mapping[bytes, RunManifest], store: Store, counting: Counting, fetcher: Fetcher,
                 publish: Callable[[ProvenFraud], Awaitable[bool]], referee: RefereeWorker, clock: Clock,
                 rng: random.Random, stats: NodeStats, timing: Timing, max_open: int = 2) -> None:
        self.identity, self.me, self.p2p, self.tracer, self.inbox = identity, identity.public_key, p2p, tracer, inbox
        self.runs, self.store, self.counting, self.fetcher, self.publish = runs, store, counting, fetcher, publish
        self.clock, self.rng, self.stats, self.referee = clock, rng, stats, referee
        self.timing = timing
        self.engaged: set[str] = set()  # peers in a dispute with us, either way
        self.server = DisputeServer(self.find, penalise=p2p.penalise, on_result=self._answered,
                                    timing=timing, clock=clock, admit=self._admit, engaged=self.engaged)
        self._opening = trio.CapacityLimiter(max_open)
        self._seen: set[tuple[bytes, int, bytes]] = set()  # (run, step, key) disputed once already
        self._settled: set[tuple[bytes, int, bytes]] = set()  # ... and settled in a dispute the peer opened
        self._pending = 0
        self._answer_started: dict[str, float] = {}
        self._answering: dict[str, tuple[bytes, int]] = {}  # peer -> the (run, step) its dispute is over
        self._next_answer: dict[str, float] = {}
        self._answered_over: set[tuple[bytes, int, bytes]] = set()  # (run, step, key) answered with our trace
        self._traces: OrderedDict[tuple[bytes, int], tuple[StepTrace, object]] = OrderedDict()
        self._tracing = trio.Lock()  # one trace computed at a time (the worker takes one anyway)
        self._nursery: trio.Nursery | None = None
        self._held: dict[tuple[bytes, int], int] = {}  # (run, step) -> disputes holding its fetched files

    async def serve_disputes(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Answer on the dispute stream and open disputes until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self.p2p.set_stream_handler(DISPUTE_PROTOCOL, self.handle)
            task_status.started()
            async for att in self.inbox.receive:
                for key in self.opponents(att):
                    if (att.run, att.step, key) in self._seen:
                        continue
                    if self._pending >= MAX_PENDING:
                        log.warning("%d disputes waiting: not disputing step %d with %s", self._pending, att.step,
                                    peer_id_from_public_key(key))
                        continue
                    self._seen.add((att.run, att.step, key))
                    self._pending += 1
                    nursery.start_soon(self._open, self.runs[att.run], att.step, key)

    # -- whom to dispute ---------------------------------------------------------------------------
    def opponents(self, att: Attestation) -> list[bytes]:
        """The keys this node disputes step ``att.step`` with, on learning ``att`` (module doc)."""
        manifest = self.runs.get(att.run)
        if manifest is None or att.step >= manifest.steps or att.pre_state != manifest.state_hashes[att.step]:
            return []
        if att.signer == self.me:
            mine = att.post_state
            keys = [manifest.publisher] if mine != manifest.state_hashes[att.step + 1] else []
            keys += [a.signer for a in self.store.attestations(att.run, att.step)
                     if a.post_state != mine and self.counting.counts(att.run, a.signer)]
        else:
            mine = self.my_post_state(manifest, att.step)
            if mine is None or att.post_state == mine or not self.counting.counts(att.run, att.signer):
                return []
            keys = [att.signer]
        return [k for k in dict.fromkeys(keys) if k != self.me]

    def my_post_state(self, manifest: RunManifest, step: int) -> bytes | None:
        """The h_{step+1} this node stands by: the published one of a run it published (and holds),
        or the one it attested; None if neither."""
        if manifest.publisher == self.me and self.store.run_dir(manifest.run_id) is not None:
            return manifest.state_hashes[step + 1]
        return next((a.post_state for a in self.store.attestations(manifest.run_id, step) if a.signer == self.me), None)

    def _convicted(self, run: bytes, step: int, keys: set[bytes]) -> bool:
        return any(p.step == step and keys & set(p.guilty) for p in self.store.fraud.of_run(run))
    # -- our party -----------------------------------------------------------------------------------
    @asynccontextmanager
    async def _run_dir(self, manifest: RunManifest, step: int) -> AsyncIterator[Path]:
        """Checkpoint ``step`` and the samples while a dispute lasts: our own run's, or fetched as
        for a replay and released when the last dispute holding them ends (they share a directory)."""
        local = self.store.run_dir(manifest.run_id)
        if local is not None:
            yield local
            return
        run_dir, blobs = await self.fetcher.for_replay(manifest, step)
        key = (manifest.run_id, step)
        self._held[key] = self._held.get(key, 0) + 1
        try:
            yield run_dir
        finally:
            self._held[key] -= 1
            if self._held[key] == 0:
                del self._held[key]
                self.fetcher.release(manifest, blobs)

    async def _party(self, manifest: RunManifest, run_dir: Path, step: int) -> Party:
        key = (manifest.run_id, step)
        async with self._tracing:
            if key not in self._traces:
                trace = await self.tracer.trace(manifest, run_dir, step)
                self._traces[key] = (trace, trace_tree(trace.records))
                while len(self._traces) > TRACES_KEPT:
                    self._traces.popitem(last=False)
            trace, tree = self._traces[key]
        commitment = TraceCommitment.create(self.identity, run=manifest.run_id, step=step, pre_state=trace.pre_state,
                                            post_state=trace.post_state, ops=len(trace.records), root=tree.root)

        async def op_data(pos: int):
            return await self.tracer.op_data(manifest, run_dir, step, pos)

        return Party(commitment, tree, trace.records, op_data)

    # -- opening -----------------------------------------------------------------------------------
    async def _open(self, manifest: RunManifest, step: int, key: bytes) -> None:
        peer, result, started = peer_id_from_public_key(key), None, self.clock.now()
        try:
            for attempt in range(BUSY_TRIES):
                if attempt:
                    await self.clock.sleep(self.rng.uniform(*BUSY_RETRY_S))  # not holding an opening slot
                if not (self.counting.counts(manifest.run_id, key) or key == manifest.publisher) or \
                        (manifest.run_id, step, key) in self._settled or \
                        self._convicted(manifest.run_id, step, {key, self.me}):
                    return  # it stopped counting, or a dispute or a proof settled the step meanwhile
                async with self._opening:
                    started = self.clock.now()
                    result = None if peer in self.engaged else await self._dispute(manifest, step, peer)
                if result is not None and not (result.outcome == "not_held" or result.code in RETRIED):
                    break
            if result is not None:
                self._record("opened", peer, (manifest.run_id, step), result, started)
        finally:
            self._pending -= 1

    async def _dispute(self, manifest: RunManifest, step: int, peer: str) -> DisputeResult | None:
        try:
            async with self._run_dir(manifest, step) as run_dir:
                party = await self._party(manifest, run_dir, step)
                if peer in self.engaged:
                    return None  # it opened one with us while we traced: after that one
                self.engaged.add(peer)
                try:
                    await self._find(manifest, peer)
                    stream = await self.p2p.open_stream(peer, DISPUTE_PROTOCOL)
                    log.info("dispute with %s over step %d opened", peer, step)
                    result = await bisect(stream, party, timing=self.timing, clock=self.clock)
                    with suppress(NetworkError):
                        await stream.close()
                finally:
                    self.engaged.discard(peer)
        except (ReplayFailed, RunFilesError, NetworkError) as exc:
            log.warning("dispute with %s over step %d not held: %s", peer, step, exc)
            return DisputeResult("not_held")
        if result.outcome == "peer_malformed":
            self.p2p.penalise(peer)
        if result.proof is not None:
            await self._publish(result)
        return result

    async def _find(self, manifest: RunManifest, peer: str) -> None:
        """A party we are not connected to provides the run's samples: the lookup stores its addresses."""
        if peer not in self.p2p.connected_peers():
            with trio.move_on_after(FIND_PROVIDERS_TIMEOUT_S):
                await self.p2p.find_providers(provider_key(samples_blob(manifest).digest))

    # -- answering ---------------------------------------------------------------------------------
    def _admit(self, peer: str) -> bool:
        now = self.clock.now()
        if now < self._next_answer.get(peer, now):
            return False
        self._answer_started[peer] = now
        return True

    def refusal(self, manifest: RunManifest, step: int, key: bytes) -> str | None:
        """Why this node does not answer ``key``'s dispute over ``step`` (the ``error`` code), or
        None: it answers the run's publisher, or a key it counts whose attestation of that step it
        holds with another post-state than its own, once per (run, step, key). Anyone else's
        dispute would cost a traced replay that nothing the node counts asks for (keys are free)."""
        mine = self.my_post_state(manifest, step)
        if mine is None:
            return "no_trace"
        run = manifest.run_id
        if (run, step, key) in self._answered_over:
            return "not_disputed"
        if key == manifest.publisher:
            warranted = mine != manifest.state_hashes[step + 1]
        else:
            warranted = self.counting.counts(run, key) and any(
                a.signer == key and a.post_state != mine for a in self.store.attestations(run, step))
        return None if warranted else "not_disputed"

    async def find(self, theirs: TraceCommitment, session: AsyncExitStack) -> Party | str:
        """Our party for the step of ``theirs`` (module doc), or the ``error`` code refusing it."""
        manifest = self.runs.get(theirs.run)
        if manifest is None or theirs.step >= manifest.steps or theirs.pre_state != manifest.state_hashes[theirs.step]:
            return "no_trace"
        refused = self.refusal(manifest, theirs.step, theirs.tracer)
        if refused is not None:
            return refused
        peer = peer_id_from_public_key(theirs.tracer)
        self._answering[peer] = (theirs.run, theirs.step)
        try:
            run_dir = await session.enter_async_context(self._run_dir(manifest, theirs.step))
            return await self._party(manifest, run_dir, theirs.step)
        except (ReplayFailed, RunFilesError) as exc:
            log.warning("cannot answer %s's dispute over step %d: %s", peer, theirs.step, exc)
            self._answering.pop(peer, None)  # ours failed: the peer may ask again
            return "no_trace"

    async def handle(self, stream: Stream) -> None:
        """Answer the dispute a peer opens on ``stream``."""
        try:
            await self.server.handle(stream)
        except ReplayFailed as exc:  # our op data could not be computed: the dispute is not held
            log.warning("dispute from %s not held: %s", stream.peer_id, exc)
            self._answering.pop(stream.peer_id, None)  # ours failed: the peer may ask again…
            self._answered(stream.peer_id, DisputeResult("not_held"))  # …after the pause its answer earned
            await stream.reset()  # the opener learns at once, not after its round timeout

    def _answered(self, peer: str, result: DisputeResult) -> None:
        now = self.clock.now()
        started = self._answer_started.pop(peer, now)
        self._next_answer = {p: t for p, t in self._next_answer.items() if t > now}  # one entry per peer paused
        self._next_answer[peer] = now + (now - started)
        over = self._answering.pop(peer, None)
        self._record("answered", peer, over, result, started)
        if over is not None:
            self._answered_over.add((*over, public_key_from_peer_id(peer)))
        if result.outcome in SETTLED and over is not None:
            self._seen.add((*over, public_key_from_peer_id(peer)))
            self._settled.add((*over, public_key_from_peer_id(peer)))
        if result.proof is not None and self._nursery is not None:
            self._nursery.start_soon(self._publish, result)

    # -- results -----------------------------------------------------------------------------------
    def _record(self, role: str, peer: str, over: tuple[bytes, int] | None, result: DisputeResult,
                started: float) -> None:
        """Counted by outcome, and kept among the recent ones (``status.disputes``)."""
        self.stats.disputes[(role, result.outcome)] += 1
        seconds = round(self.clock.now() - started, 3)  # our trace and the bisection, or the answer's whole session
        self.stats.recent_disputes.append({
            "role": role, "peer": peer, "run": over[0].hex() if over else None, "step": over[1] if over else None,
            "outcome": result.outcome, "rounds": result.rounds, "position": result.position, "seconds": seconds,
            "proof_bytes": len(result.proof) if result.proof else None, "peer_at_fault": result.peer_at_fault})
        log.info("dispute with %s (%s): %s after %d rounds, %.2f s", peer, role, result.outcome, result.rounds, seconds)

    async def _publish(self, result: DisputeResult) -> None:
        # the bisection judged the proof it built (in a worker thread): that verdict, read off the
        # event loop, then the node's rules as for any proof (node/referee_worker.py)
        verdict = await self.referee.carry(result.proof, result.verdict)
        if verdict.code == "held":  # the other party's proof of it (a lower digest) came first: nothing to carry
            log.info("our dispute's proof adds nothing to the proofs kept: %s", verdict.reason)
            return
        if verdict.outcome is not Outcome.ACCEPT:
            log.warning("our dispute's proof is not carried (%s: %s): judge it offline", verdict.code, verdict.reason)
            return
        await self.publish(verdict.message)

