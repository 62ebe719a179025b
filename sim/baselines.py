"""Other ways to share out the work, on the same loop, machines, churn schedule and tracker.

* ``central``: an ideal coordinator. It knows every node's state instantly and for free, hands a
  node that asks the most-wanted (step, slot) it has not replayed (breadth first: every step
  once before any step twice), never hands one out twice, and reassigns the work of a node that
  leaves at once, to the fastest idle node.
* ``segments``: the incumbent's scheme. Steps form segments of 100 replayed strictly in order —
  an auditor starts from the previous auditor's hand-off — so each segment is a chain; with
  redundancy R each segment has R chains. A central coordinator hands out the next step of the
  least advanced ready chain. Hand-off upload and download time is *not* charged (it favours
  the incumbent).
* ``random``: blind uniform self-selection, no claims and no coverage: a node replays a uniformly
  random step it has not replayed. The anchors' arithmetic: N·e^(−R) steps left uncovered.
* ``random-aware``: self-selection with coverage but no claims: a node replays a uniformly random
  step that (as far as attestations show) still wants attesters. Work in progress is invisible.

These are models of *assignment*, without a network: they get every message instantly, which
only flatters them.
"""

from __future__ import annotations

import heapq
import math
import time

from .loop import EventLoop
from .params import Population, Scenario, node_rng, summary
from .tracker import Tracker


class _Baseline:
    def __init__(self, sc: Scenario) -> None:
        if sc.adversary_share or sc.forged_steps:
            raise ValueError("baselines model honest auditors only")
        self.sc = sc
        self.loop = EventLoop()
        self.tracker = Tracker(sc.steps, sc.redundancy)
        self.population = Population(sc, self.loop, self.join, self.leave)
        self.keys = [i.to_bytes(8, "little") for i in range(sc.nodes)]
        self.rngs = [node_rng(sc.seed, i, "node") for i in range(sc.nodes)]
        self.done: list[set[int]] = [set() for _ in range(sc.nodes)]
        self.busy: dict[int, tuple[int, float, int]] = {}  # node -> (step, started, token)
        self._token = 0
        self.aborted, self.wasted_s = 0, 0.0

    def start(self, i: int, step: int) -> None:
        self._token += 1
        self.busy[i] = (step, self.loop.now, self._token)
        seconds = self.population.hardware[i].replay_seconds(self.rngs[i])
        self.loop.call_at(self.loop.now + seconds, self._complete, (i, self._token))

    def _complete(self, item: tuple[int, int]) -> None:
        i, token = item
        current = self.busy.get(i)
        if current is None or current[2] != token:
            return  # the node left meanwhile
        step = current[0]
        del self.busy[i]
        self.done[i].add(step)
        self.tracker.add(step, self.keys[i], True, self.loop.now, device=self.population.hardware[i].device)
        if not self.tracker.done:
            self.finished(i, step)

    def leave(self, i: int) -> None:
        current = self.busy.pop(i, None)
        if current is not None:
            self.aborted += 1
            self.wasted_s += self.loop.now - current[1]
        self.left(i, current[0] if current else None)

    # what each strategy decides
    def join(self, i: int) -> None:
        raise NotImplementedError

    def finished(self, i: int, step: int) -> None:
        raise NotImplementedError

    def left(self, i: int, step: int | None) -> None:
        raise NotImplementedError

    def simulate(self) -> dict:
        started = time.perf_counter()
        self.population.start()
        self.loop.run(until=self.sc.max_seconds, stop=lambda: self.tracker.done)
        return summary(self.sc, self.tracker, self.loop, in_flight=len(self.busy), aborted=self.aborted,
                       wasted_s=self.wasted_s, extra={}, wall_s=time.perf_counter() - started)


class _Coordinated(_Baseline):
    """A coordinator that knows everything at once: whenever work is ready and nodes are idle,
    the most urgent work goes to the fastest idle node that has not replayed that step."""

    def __init__(self, sc: Scenario) -> None:
        super().__init__(sc)
        self.idle: set[int] = set()
        self._by_speed: list[tuple[float, int]] = []  # idle nodes, fastest first (stale entries skipped)
        self._pending = False

    def _idle(self, i: int) -> None:
        self.idle.add(i)
        heapq.heappush(self._by_speed, (self.population.hardware[i].seconds, i))

    def _fastest_idle(self, step: int) -> int | None:
        skipped, found = [], None
        while self._by_speed:
            item = heapq.heappop(self._by_speed)
            i = item[1]
            if i not in self.idle:
                continue
            if step in self.done[i]:
                skipped.append(item)
                continue
            found = i
            break
        for item in skipped:
            heapq.heappush(self._by_speed, item)
        return found

    def dispatch(self) -> None:
        held = []
        while self.idle:
            work = self.take()
            if work is None:
                break
            i = self._fastest_idle(self.step_of(work))
            if i is None:
                held.append(work)  # every idle node has replayed this step
                continue
            self.idle.discard(i)
            self.assign(i, work)
        for work in held:
            self.put_back(work)

    def join(self, i: int) -> None:
        self._idle(i)
        self._dispatch_soon()

    def finished(self, i: int, step: int) -> None:
        self._idle(i)
        self._dispatch_soon()

    def left(self, i: int, step: int | None) -> None:
        self.idle.discard(i)
        self._dispatch_soon()

    def _dispatch_soon(self) -> None:
        """Dispatch once everything happening at this instant has happened: when all nodes join
        at once, the fastest get the work, not the first to be counted."""
        if not self._pending:
            self._pending = True
            self.loop.call_at(self.loop.now, self._dispatch_now)

    def _dispatch_now(self, _=None) -> None:
        self._pending = False
        self.dispatch()

    # the work queue
    def take(self):
        raise NotImplementedError

    def put_back(self, work) -> None:
        raise NotImplementedError

    def step_of(self, work) -> int:
        raise NotImplementedError

    def assign(self, i: int, work) -> None:
        raise NotImplementedError


class Central(_Coordinated):
    def __init__(self, sc: Scenario) -> None:
        super().__init__(sc)
        self.in_progress = [0] * sc.steps
        self.queue = [(-sc.redundancy, s) for s in range(sc.steps)]  # (-need, step); stale entries skipped
        heapq.heapify(self.queue)

    def need(self, step: int) -> int:
        return self.tracker.want(step) - self.in_progress[step]

    def take(self) -> int | None:
        while self.queue:
            neg, step = heapq.heappop(self.queue)
            if -neg == self.need(step) and -neg > 0:
                return step
        return None

    def put_back(self, step: int) -> None:
        heapq.heappush(self.queue, (-self.need(step), step))

    def step_of(self, step: int) -> int:
        return step

    def assign(self, i: int, step: int) -> None:
        self.in_progress[step] += 1
        if self.need(step) > 0:
            heapq.heappush(self.queue, (-self.need(step), step))
        self.start(i, step)

    def finished(self, i: int, step: int) -> None:
        self.in_progress[step] -= 1
        super().finished(i, step)

    def left(self, i: int, step: int | None) -> None:
        if step is not None:
            self.in_progress[step] -= 1
            heapq.heappush(self.queue, (-self.need(step), step))
        super().left(i, step)


class Segments(_Coordinated):
    def __init__(self, sc: Scenario) -> None:
        super().__init__(sc)
        n = math.ceil(sc.steps / sc.segment)
        self.pos = {(g, c): 0 for g in range(n) for c in range(sc.redundancy)}
        self.ready = [(0, g, c) for g in range(n) for c in range(sc.redundancy)]  # least advanced first
        heapq.heapify(self.ready)
        self.chain_of: dict[int, tuple[int, int]] = {}

    def _end(self, g: int) -> int:
        return min(self.sc.steps, (g + 1) * self.sc.segment)

    def take(self):
        return heapq.heappop(self.ready) if self.ready else None

    def put_back(self, work) -> None:
        heapq.heappush(self.ready, work)

    def step_of(self, work) -> int:
        pos, g, _ = work
        return g * self.sc.segment + pos

    def assign(self, i: int, work) -> None:
        _, g, c = work
        self.chain_of[i] = (g, c)
        self.start(i, self.step_of(work))

    def _release(self, chain: tuple[int, int]) -> None:
        g, c = chain
        if g * self.sc.segment + self.pos[chain] < self._end(g):
            heapq.heappush(self.ready, (self.pos[chain], g, c))

    def finished(self, i: int, step: int) -> None:
        chain = self.chain_of.pop(i)
        self.pos[chain] += 1  # the next auditor starts from this one's hand-off
        self._release(chain)
        super().finished(i, step)

    def left(self, i: int, step: int | None) -> None:
        chain = self.chain_of.pop(i, None)
        if chain is not None:
            self._release(chain)
        super().left(i, step)


class _SelfSelected(_Baseline):
    def pick(self, i: int) -> int | None:
        raise NotImplementedError

    def _go(self, i: int) -> None:
        step = self.pick(i)
        if step is not None:
            self.start(i, step)

    def join(self, i: int) -> None:
        self._go(i)

    def finished(self, i: int, step: int) -> None:
        self._go(i)

    def left(self, i: int, step: int | None) -> None:
        pass


class RandomBlind(_SelfSelected):
    def pick(self, i: int) -> int | None:
        rng, done = self.rngs[i], self.done[i]
        if len(done) >= self.sc.steps:
            return None
        while True:
            step = rng.randrange(self.sc.steps)
            if step not in done:
                return step


class RandomAware(_SelfSelected):
    """Uniform over the steps attestations show as still wanting attesters (no claims, so work
    in progress is invisible). Once no such step is left for a node, it never will be."""

    def __init__(self, sc: Scenario) -> None:
        super().__init__(sc)
        self.open = list(range(sc.steps))
        self.where = {s: s for s in range(sc.steps)}

    def pick(self, i: int) -> int | None:
        rng, done = self.rngs[i], self.done[i]
        for _ in range(64):
            if not self.open:
                return None
            step = self.open[rng.randrange(len(self.open))]
            if step not in done:
                return step
        todo = [s for s in self.open if s not in done]
        return rng.choice(todo) if todo else None

    def finished(self, i: int, step: int) -> None:
        if self.tracker.want(step) <= 0 and step in self.where:
            k = self.where.pop(step)
            last = self.open.pop()
            if last != step:
                self.open[k] = last
                self.where[last] = k
        super().finished(i, step)


def run_baseline(sc: Scenario) -> dict:
    cls = {"central": Central, "segments": Segments, "random": RandomBlind, "random-aware": RandomAware}[sc.strategy]
    return cls(sc).simulate()
