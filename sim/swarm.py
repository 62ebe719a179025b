"""open1b nodes on the simulated network, running the daemon's own claiming code.

Each virtual node does what ``Daemon._audit_loop`` does: ask :func:`open1b.node.planner.pick`
for its best four candidates in its own view, try them in order with a real
:class:`~open1b.node.claim_records.ClaimAgent` (over :class:`~.network.SimBoard`), replay for as long
as its hardware takes while :meth:`ClaimAgent.hold` renews the lease, then sign a real
:class:`~open1b.protocol.Attestation` and gossip it; with nothing to claim it waits
``idle_poll_s``.

A node's view of the run — which statements it holds — is where the simulator has to be clever
at 10,000 nodes × 80,957 steps: giving each node its own :class:`~open1b.node.deficits.DeficitIndex`
means delivering every statement 10,000 times. Two implementations, same answers:

* ``exact``: one real index per node, fed each statement at the time gossip delivers it.
* ``overlay`` (default): one shared index holding every statement as soon as it exists, plus, per
  node and per pick, the few steps on which that node still lacks a statement (published within
  the gossip horizon, or stored in the DHT but not yet announced), or holds its own live claim.
  Those steps are recomputed from the statements the node does hold with the same
  :func:`~open1b.node.planner.step_deficit` the index uses.

Parking: with ``overlay``, a node whose poll found nothing is not polled again until something
can open a step for it (a lease running out, a dispute, a lease ending near a statement still in
flight); it then resumes on its own poll grid, so it polls at the same instants as if it had
polled all along (:meth:`Swarm.may_park` has the argument). tests/node/test_sim.py checks
``overlay`` + parking against ``exact`` + polling, event for event.
"""

from __future__ import annotations

import bisect
import math
import time
from collections import deque
from typing import Iterable

import numpy as np

from open1b.node import planner
from open1b.node.claim_records import ClaimAgent
from open1b.node.deficits import DeficitIndex
from open1b.protocol import MATCH, MISMATCH, Attestation, Claim
from open1b.protocol.hashing import blake2b256
from open1b.protocol.witness import witness_binding

from .crypto import MessageCache, sim_identity
from .loop import DELIVER, PARK, At, Delay, EventLoop, Task
from .network import Gossip, SimBoard, SimDHT
from .params import Population, Scenario, forged_steps, node_rng, summary
from .tracker import Tracker

# Simulated replays compute nothing, so every step shares one stand-in witness; the signed
# attestation still carries a binding, so message sizes and signing costs are the real ones.
SIM_WITNESS = blake2b256(b"open1b/sim/witness")

ENGINE, ENGINE_VERSION = "sim", "1"


class Event:
    """A statement as the simulated network knows it."""

    __slots__ = ("eid", "step", "origin", "attestation", "key", "issued", "expiry", "match", "announced",
                 "expected", "device", "post")

    def __init__(self, eid, step, origin, attestation, key, issued=0, expiry=0, match=True, expected=None, device=None,
                 post=None):
        self.eid, self.step, self.origin, self.attestation, self.key = eid, step, origin, attestation, key
        self.issued, self.expiry, self.match = issued, expiry, match
        # a claim's expected_done and device class; an attestation's replay seconds and device class
        self.expected, self.device = expected, device
        self.post = post  # an attestation's post_state (the tie rule, planner.wanted)
        self.announced: float | None = None  # when gossip began; None while only in the DHT


class OverlayView:
    """A node's view: the shared index, with some steps recomputed from what the node holds."""

    def __init__(self, base: DeficitIndex, overrides: dict[int, planner.StepState]) -> None:
        self.base, self.redundancy, self.overrides = base, base.redundancy, overrides
        r = base.redundancy
        self._bucket = {s: planner.bucket_of(st.deficit, st.disputed, r) for s, st in overrides.items()}
        # what the overrides add to or take from each bucket's size, and a sorted lookup of their
        # buckets for buckets_of: computed once, as pick asks several times
        self._resize = [0] * planner.bucket_count(r)
        for step, b in self._bucket.items():
            self._resize[b] += 1
            self._resize[base.bucket(step)] -= 1
        self._steps = np.fromiter(sorted(self._bucket), dtype=np.int64, count=len(self._bucket))
        self._ids = np.fromiter((self._bucket[s] for s in self._steps.tolist()), dtype=np.int8, count=len(self._bucket))

    def bucket_size(self, bucket: int) -> int:
        return self.base.bucket_size(bucket) + self._resize[bucket]

    def open_buckets(self) -> list[int]:
        return [b for b in range(planner.bucket_count(self.redundancy) - 1, 0, -1) if self.bucket_size(b) > 0]

    def bucket_members(self, bucket: int) -> Iterable[int]:
        for step in self.base.bucket_members(bucket):
            if step not in self._bucket:
                yield step
        for step, b in self._bucket.items():
            if b == bucket:
                yield step

    def buckets_of(self, steps: np.ndarray) -> np.ndarray:
        ids = self.base.buckets_of(steps)
        at = np.minimum(np.searchsorted(self._steps, steps), len(self._steps) - 1)
        hit = self._steps[at] == steps
        ids[hit] = self._ids[at[hit]]
        return ids

    def state(self, step: int) -> planner.StepState:
        return self.overrides.get(step) or self.base.state(step)

    # The tail and device classes come from the shared index: statistics of the whole run, in
    # which the few statements a node lacks change little (a node's own view differs by those).
    def tail(self) -> planner.Tail:
        return self.base.tail()

    def stragglers(self, after: int, exclude, limit: int) -> list[int]:
        return [s for s in self.base.stragglers(after, exclude, limit) if self.state(s).deficit <= 0]

    def matched_by(self, device: str):
        return self.base.matched_by(device)

    def attested_steps(self):
        return self.base.attested_steps()

    def class_wait(self, device: str):
        return self.base.class_wait(device)


class LazyView:
    """:meth:`Swarm.overlay`, built when the planner first asks for more than the tail. A node
    that fails the deadline (planner.meets_deadline) plans from the run-wide tail alone, which
    the overlay takes from the shared index anyway; at the tail most polls are such nodes', so
    building their overlay was most of the simulator's cost (O(statements in flight) each)."""

    def __init__(self, swarm: "Swarm", node: "Node") -> None:
        self.swarm, self.node, self.redundancy = swarm, node, swarm.sc.redundancy
        self._view: planner.DeficitView | None = None

    def tail(self) -> planner.Tail:
        return self.swarm.index.tail()

    def class_wait(self, device: str):
        """From the shared index, as the tail; kept, so that parking can see whether it held a step back."""
        self.node.wait = self.swarm.index.class_wait(device)
        return self.node.wait

    def __getattr__(self, name: str):
        # only names the class lacks get here: the DeficitView methods, from the overlay
        if self._view is None:
            self._view = self.swarm.overlay(self.node)
        return getattr(self._view, name)


class Node:
    def __init__(self, swarm: "Swarm", idx: int) -> None:
        sc = swarm.sc
        self.swarm, self.idx = swarm, idx
        self.identity = sim_identity(sc.seed, idx, sc.crypto)
        self.key = self.identity.public_key
        self.hardware = swarm.population.hardware[idx]
        # Refined by each measured replay, as the daemon's auditor does; it starts from the
        # hardware's typical time, as a node's declared or benchmarked speed would.
        self.estimate = planner.ReplayEstimate(self.hardware.seconds)
        self.behaviour = swarm.population.behaviour[idx]
        self.rng = node_rng(sc.seed, idx, "node")
        self.board = SimBoard(swarm.dht, sc.network, node_rng(sc.seed, idx, "net"), self, swarm.announced)
        self.agent = ClaimAgent(self.identity, self.board, lease_s=sc.lease_s, clock=swarm.clock, sleep=Delay,
                                seen=self.saw, rng=self.rng, decode=swarm.cache.decode)
        self._order: planner.StepOrder | None = None
        self.done: set[int] = set()
        self.seen: set[int] = set()  # events this node read from the DHT
        self.own: list[Event] = []  # this node's claim events that may still be live
        self.index = DeficitIndex(sc.steps, sc.redundancy, me=self.key) if sc.view == "exact" else None
        self.task: Task | None = None
        self.holder: Task | None = None
        self.replaying: tuple[int, float] | None = None  # (step, started)
        self.wait = None  # the class wait of its last pick (DeficitIndex.class_wait), if it asked
        self.anchor: float | None = None  # idle poll grid: polls at anchor + k × idle_poll_s
        self.k = 0
        self.phase = 0.0  # anchor mod idle_poll_s, while parked

    @property
    def order(self) -> planner.StepOrder:
        if self._order is None:  # built on first use: O(steps) each, so not for nodes that never pick
            self._order = planner.StepOrder(self.swarm.run, self.key, self.swarm.sc.steps)
        return self._order

    def saw(self, claim: Claim) -> None:
        """ClaimAgent's ``seen``: the daemon stores every claim it reads or makes."""
        sw = self.swarm
        if claim.claimant == self.key:
            sw.cache.remember(claim)
            return
        event = sw.by_digest.get(claim.digest)
        if event is not None:
            self.seen.add(event.eid)
            if self.index is not None:
                self.index.add_claim(claim.step, claim.claimant, claim.issued_at, claim.lease_expiry, claim.expected_done,
                                     claim.device)

    async def audit(self) -> None:
        """``Daemon._audit_loop``, on simulated time and network."""
        sw, sc = self.swarm, self.swarm.sc
        run = sw.run
        while True:
            view = sw.view(self)
            cands = planner.plan(view, self.order, now=sw.clock(), exclude=self.done, limit=4,
                                 device=self.hardware.device if sc.diversity else None,
                                 estimate_s=self.estimate.seconds, tail=sc.tail)
            claim = None
            waits = self.waits if sc.diversity else None
            for cand in cands:
                claim = await self.agent.try_claim(run, cand, estimate_s=self.estimate.seconds, waits=waits,
                                                   device=self.hardware.device if sc.diversity else None)
                if claim is not None:
                    sw.speculative += cand.speculative
                    break
            if claim is None:
                if not cands and self.anchor is not None:
                    self.k += 1
                else:
                    self.anchor, self.k = sw.loop.now, 1
                if not cands and sw.may_park(self):
                    sw.park(self)
                    await PARK
                else:
                    await At(self.anchor + self.k * sc.idle_poll_s)
                continue
            self.anchor = None
            await self.replay(claim)

    def waits(self, step: int) -> bool:
        """try_claim's ``waits``: the class wait, now, in the index this node plans with."""
        index = self.index if self.index is not None else self.swarm.index
        index.advance(self.swarm.clock())
        return step in index.class_wait(self.hardware.device)

    async def replay(self, claim: Claim) -> None:
        sw = self.swarm
        self.holder = sw.loop.spawn(self.agent.hold(claim))
        self.replaying = (claim.step, sw.loop.now)
        if sw.first_replay is None:
            sw.first_replay = sw.loop.now
        seconds = self.hardware.replay_seconds(self.rng)
        try:
            await Delay(seconds)
        finally:
            self.holder.cancel()
            self.holder = None
        self.replaying = None
        self.estimate.update(seconds)
        sw.attest(self, claim.step, seconds)


class Swarm:
    def __init__(self, sc: Scenario) -> None:
        if sc.view == "exact" and sc.parking:
            raise ValueError("parking needs the overlay view")
        self.sc = sc
        self.loop = EventLoop()
        self.run = blake2b256(b"open1b/sim/run", sc.seed.to_bytes(8, "little"))
        self.cache = MessageCache(sc.crypto)
        self.dht = SimDHT(self.cache, self.stored)
        self.gossip = Gossip(sc.network, sc.seed)
        self.horizon = sc.network.max_gossip_delay
        self.forged = forged_steps(sc)
        self.tracker = Tracker(sc.steps, sc.redundancy, self.forged)
        self.index = DeficitIndex(sc.steps, sc.redundancy, listener=self._moved)
        self.open_steps = sc.steps
        # per step, its attestations and its claims not known to be over: what a lagging node's
        # view recomputes from (a step's expired claims, renewals above all, would make that
        # O(the step's history) — hours of renewals for a slow replay)
        self.attested: dict[int, list[Event]] = {}
        self.claimed: dict[int, list[Event]] = {}
        self.by_digest: dict[bytes, Event] = {}
        self.recent: deque[Event] = deque()  # announced within the gossip horizon, oldest first
        self.pending: dict[int, Event] = {}  # in the DHT, not announced yet
        self._claimants: set[tuple[int, bytes]] = set()  # (step, claimant) pairs seen: renewals are not news
        self._eid = 0
        self.quiet_from = 0.0  # no parking before this: something may yet open for a lagging node
        self.parked: dict[int, Node] = {}
        self._phases: list[tuple[float, int]] = []  # parked nodes by poll phase (anchor mod idle_poll_s)
        self._sweeping = False
        self.parks = 0
        self.speculative = 0  # speculative claims won (planner.speculative_candidate)
        self.first_replay: float | None = None
        self.aborted, self.wasted_s = 0, 0.0
        self.population = Population(sc, self.loop, self.join, self.leave)
        self.nodes = [Node(self, i) for i in range(sc.nodes)]

    # -- clock and published hashes ------------------------------------------------------------
    def clock(self) -> int:
        return int(self.loop.now)

    def published(self, k: int) -> bytes:
        return blake2b256(b"open1b/sim/state", self.run, k.to_bytes(8, "little"))

    def computed(self, k: int) -> bytes:
        """What an honest replay of step k - 1 yields: the published hash, unless it was forged."""
        if k - 1 in self.forged:
            return blake2b256(b"open1b/sim/true-state", self.run, k.to_bytes(8, "little"))
        return self.published(k)

    # -- churn -----------------------------------------------------------------------------------
    def join(self, i: int) -> None:
        node = self.nodes[i]
        node.anchor = None
        node.task = self.loop.spawn(node.audit())

    def leave(self, i: int) -> None:
        node = self.nodes[i]
        if i in self.parked:
            self._unpark(node)
        if node.replaying is not None:
            self.aborted += 1
            self.wasted_s += self.loop.now - node.replaying[1]
            node.replaying = None
        if node.task is not None:
            node.task.cancel()
            node.task = None

    # -- statements ------------------------------------------------------------------------------
    def _event(self, step, origin, attestation, key, issued=0, expiry=0, match=True, expected=None, device=None,
               post=None) -> Event:
        self._eid += 1
        e = Event(self._eid, step, origin, attestation, key, issued, expiry, match, expected, device, post)
        (self.attested if attestation else self.claimed).setdefault(step, []).append(e)
        return e

    def _claim_event(self, claim: Claim, origin: Node) -> Event:
        e = self.by_digest.get(claim.digest)
        if e is None:
            e = self._event(claim.step, origin.idx, False, claim.claimant, claim.issued_at, claim.lease_expiry,
                            expected=claim.expected_done, device=claim.device)
            self.by_digest[claim.digest] = e
            self.index.advance(self.clock())
            self.index.add_claim(claim.step, claim.claimant, claim.issued_at, claim.lease_expiry, claim.expected_done,
                                 claim.device)
            fresh = (claim.step, claim.claimant) not in self._claimants
            self._claimants.add((claim.step, claim.claimant))
            if fresh and claim.expected_done is not None and self.sc.tail and self.open_steps == 0:
                # a new straggler may be worth a speculative claim to a parked node
                self._stir(self.loop.now + self.horizon)
            origin.own.append(e)
            self.loop.call_at(float(claim.lease_expiry), self._expired, e)
        return e

    def stored(self, claim: Claim, writer: Node) -> None:
        """The DHT stored a claim: from now on a reader may learn it before gossip brings it."""
        e = self._claim_event(claim, writer)
        if e.announced is None:
            self.pending[e.eid] = e

    def announced(self, claim: Claim, node: Node) -> None:
        e = self._claim_event(claim, node)
        self.pending.pop(e.eid, None)
        self._publish(e)

    def attest(self, node: Node, step: int, seconds: float) -> None:
        published = self.published(step + 1)
        honest_post = self.computed(step + 1)
        if node.behaviour == "honest":
            post = honest_post
        elif node.behaviour == "lazy":
            post = published  # copies the published hash: "match", replay or not
        else:  # liar: contradicts the truth — flags honest steps, vouches for forged ones
            post = bytes(32) if honest_post == published else published
        att = Attestation.create(node.identity, run=self.run, step=step, pre_state=self.published(step), post_state=post,
                                 verdict=MATCH if post == published else MISMATCH, engine=ENGINE,
                                 engine_version=ENGINE_VERSION, hardware=node.hardware.name, device=node.hardware.device,
                                 elapsed_ms=int(seconds * 1000), issued_at=self.clock(),
                                 witness=witness_binding(self.run, step, node.identity.public_key, SIM_WITNESS))
        match = att.verdict == MATCH
        node.done.add(step)
        e = self._event(step, node.idx, True, att.signer, match=match, expected=att.elapsed_ms / 1000,
                        device=att.device, post=post)
        self.index.advance(self.clock())
        self.index.add_attestation(step, att.signer, match, att.device, att.elapsed_ms / 1000, post_state=post)
        if node.index is not None:
            node.index.add_attestation(step, att.signer, match, att.device, att.elapsed_ms / 1000, post_state=post)
        self.tracker.add(step, att.signer, match, self.loop.now, node.behaviour, att.device)
        self._publish(e)
        if not match:  # a dispute raises a step's target: lagging nodes may see it open later
            self._stir(self.loop.now + self.horizon)

    def _publish(self, e: Event) -> None:
        now = self.loop.now
        e.announced = now
        self.recent.append(e)
        if self.sc.view == "exact":
            for node in self.nodes:
                if node.idx != e.origin:
                    self.loop.call_at(now + self.gossip.delay(node.idx, e.eid), self._deliver, (node, e), DELIVER)

    def _deliver(self, item: tuple[Node, Event]) -> None:
        node, e = item
        if node.index is None:
            return
        if e.attestation:
            node.index.add_attestation(e.step, e.key, e.match, e.device, e.expected, post_state=e.post)
        else:
            node.index.add_claim(e.step, e.key, e.issued, e.expiry, e.expected, e.device)

    def _expired(self, e: Event) -> None:
        now, t = self.loop.now, self.clock()
        self.pending.pop(e.eid, None)  # a lease that is over matters to nobody
        self.index.advance(t)  # may open the step (listener)
        if self.sc.tail and self.index.straggling(e.step) is not None:
            # a claim ended unfinished: the step may now wait on a later straggler
            self._stir(now + self.horizon)
        # If another statement on this step is still on its way to some node, that node may see
        # the step open though it is not: keep lagging nodes polling until it has arrived.
        for other in self.statements(e.step, t):
            if other is e:
                continue
            if other.announced is None or other.announced > now - self.horizon:
                self._stir(now + self.horizon)
                break

    def statements(self, step: int, t: int) -> list[Event]:
        """The step's attestations and its claims whose lease is not over at ``t`` (which never
        goes back: a claim over now is over for good, so it is dropped)."""
        claims = self.claimed.get(step, [])
        if any(e.expiry <= t for e in claims):
            claims = self.claimed[step] = [e for e in claims if e.expiry > t]
        return self.attested.get(step, []) + claims

    # -- views -----------------------------------------------------------------------------------
    def knows(self, node: Node, e: Event, now: float) -> bool:
        if e.announced is not None and e.announced <= now - self.horizon:
            return True  # gossip delivers everything within the horizon
        return (e.origin == node.idx or e.eid in node.seen
                or (e.announced is not None and e.announced + self.gossip.delay(node.idx, e.eid) <= now))

    def view(self, node: Node) -> planner.DeficitView:
        t = self.clock()
        if node.index is not None:
            node.index.advance(t)
            return node.index
        self.index.advance(t)
        node.wait = None
        return LazyView(self, node)

    def overlay(self, node: Node) -> planner.DeficitView:
        """The node's view now: the shared index (advanced by :meth:`view`), with the steps it
        lags on recomputed."""
        now, t = self.loop.now, self.clock()
        while self.recent and self.recent[0].announced <= now - self.horizon:
            self.recent.popleft()
        # An expired claim counts for nobody, so not holding it changes nothing. ``unknown``: the
        # events this node lacks; every other statement on a lagging step it holds (older than
        # the horizon, its own, or already delivered), so each is judged once per pick.
        me = node.idx
        unknown = {e.eid: e.step for e in self.recent
                   if e.origin != me and (e.attestation or e.expiry > t) and not self.knows(node, e, now)}
        unknown.update((e.eid, e.step) for e in self.pending.values()
                       if e.origin != me and e.expiry > t and e.eid not in node.seen)
        lagging = set(unknown.values())
        node.own = [e for e in node.own if e.expiry > t]
        lagging.update(e.step for e in node.own if e.issued <= t and e.step not in node.done)
        if not lagging:
            return self.index
        return OverlayView(self.index, {s: self._state_for(node, s, unknown, t) for s in lagging})

    def _state_for(self, node: Node, step: int, unknown: dict[int, int], t: int) -> planner.StepState:
        attesters: set[bytes] = set()
        busy = []
        disputed = False
        posts: dict[bytes, set[bytes]] = {}  # post_state -> keys that report it
        for e in self.statements(step, t):
            if e.eid in unknown:
                continue
            if e.attestation:
                attesters.add(e.key)
                disputed |= not e.match
                posts.setdefault(e.post, set()).add(e.key)
            elif e.key != node.key and e.issued <= t < e.expiry:
                busy.append(e.key)
        tied = planner.tied(len(keys) for keys in posts.values())
        return planner.StepState(planner.step_deficit(self.sc.redundancy, disputed, attesters, busy, tied), disputed,
                                 frozenset(attesters), tied)

    # -- parking ---------------------------------------------------------------------------------
    def _moved(self, step: int, old: int, new: int) -> None:
        if old == 0 and new > 0:
            self.open_steps += 1
            if self.open_steps == 1:
                self._wake(math.inf)  # a step opened for everyone: resume nodes until it closes
        elif old > 0 and new == 0:
            self.open_steps -= 1
            if self.open_steps == 0:  # nodes that have not heard of the closing claim still see it open
                self.quiet_from = max(self.quiet_from, self.loop.now + self.horizon)

    def may_park(self, node: Node) -> bool:
        """Called after a poll that found nothing: would every later poll find nothing too,
        until a trigger wakes the node? Yes. The statements a node has yet to receive can only
        lower its deficits (more attesters, more busy claimants), except a mismatch, which
        triggers a wake-up window (:meth:`attest`); and a step can only reopen for it when a
        lease it knows of ends, which either opens the step for everyone (:meth:`_moved`) or
        happens while another statement on the step is in flight (:meth:`_expired`). While such
        a window is open the node keeps polling: the sweep already in progress would pass it by."""
        held = node.wait is not None and node.wait.held  # a step it will take once the class wait is over
        return self.sc.parking and not held and not self._active(self.loop.now) and not self._may_speculate(node)

    def _may_speculate(self, node: Node) -> bool:
        """A straggler this node would beat. Such chances only shrink as time passes (the
        holders' expected_done stays, now grows), so a node that has none now has none until a
        new claim brings one (:meth:`_claim_event` wakes parked nodes for it)."""
        est = node.estimate.seconds
        if not self.sc.tail or est is None:
            return False
        self.index.advance(self.clock())
        return bool(self.index.stragglers(planner.speculate_after(est, self.clock()), node.done, 1))

    def _active(self, now: float) -> bool:
        return self.open_steps > 0 or now < self.quiet_from

    def park(self, node: Node) -> None:
        self.parks += 1
        node.phase = node.anchor % self.sc.idle_poll_s
        bisect.insort(self._phases, (node.phase, node.idx))
        self.parked[node.idx] = node

    def _unpark(self, node: Node) -> None:
        del self.parked[node.idx]
        del self._phases[bisect.bisect_left(self._phases, (node.phase, node.idx))]

    def _stir(self, until: float) -> None:
        """A step may look open to a lagging node until ``until``."""
        self.quiet_from = max(self.quiet_from, until)
        self._wake(until)

    def _wake(self, until: float) -> None:
        """Something may look open to some node from now until ``until`` (or, if ``until`` is
        infinite, until no step is open): start resuming parked nodes, one at a time, at their
        next poll instants, for as long as that holds."""
        if not self._sweeping and self.parked:
            self._sweeping = True
            self._sweep_next()

    def _sweep_next(self) -> None:
        """Schedule the sweep at the parked node that polls next (in poll-grid order)."""
        if not self.parked:
            self._sweeping = False
            return
        now, poll = self.loop.now, self.sc.idle_poll_s
        here = now % poll
        at = bisect.bisect_left(self._phases, (here, -1))
        n = len(self._phases)
        best = None
        for j in range(n):  # phase order is poll order, except for a node that polled just now
            phase, idx = self._phases[(at + j) % n]
            if best is not None and now + (phase - here) % poll > best[2] + 1e-6:
                break
            node = self.parked[idx]
            k = max(node.k, math.ceil((now - node.anchor) / poll))
            when = node.anchor + k * poll
            if when < now:
                k, when = k + 1, node.anchor + (k + 1) * poll
            if best is None or when < best[2]:
                best = (node, k, when)
        self.loop.call_at(best[2], self._sweep, best)

    def _sweep(self, item) -> None:
        node, k, when = item
        if not self._active(self.loop.now):
            self._sweeping = False  # every later poll would find nothing, until the next trigger
            return
        if self.parked.get(node.idx) is node and node.anchor + k * self.sc.idle_poll_s == when:
            self._unpark(node)
            node.k = k
            self.loop.resume_at(node.task, when)
        self._sweep_next()

    def _reporting(self, progress):
        """The loop's stop test, telling ``progress`` how far the run got about once a wall minute."""
        last = [time.perf_counter()]

        def stop() -> bool:
            if self.loop.events % 65536 == 0 and time.perf_counter() - last[0] > 60:
                last[0] = time.perf_counter()
                progress(self.loop.now, self.tracker.satisfied)
            return self.tracker.done

        return stop

    # -- run -------------------------------------------------------------------------------------
    def simulate(self, progress=None) -> dict:
        started = time.perf_counter()
        self.population.start()
        stop = (lambda: self.tracker.done) if progress is None else self._reporting(progress)
        self.loop.run(until=self.sc.max_seconds, stop=stop)
        in_flight = sum(1 for n in self.nodes if n.replaying is not None)
        agents = [n.agent for n in self.nodes]
        extra = {
            "claims_won": sum(a.won for a in agents), "claims_lost": sum(a.lost for a in agents),
            "lease_renewals": sum(a.renewed for a in agents), "dht_reads": self.dht.reads,
            "dht_writes": self.dht.writes, "claims_verified": self.cache.verified,
            "first_replay_start_s": self.first_replay,
            "speculative_claims": self.speculative,
        }
        return summary(self.sc, self.tracker, self.loop, in_flight=in_flight, aborted=self.aborted,
                       wasted_s=self.wasted_s, extra=extra, wall_s=time.perf_counter() - started)
