"""A virtual-time event loop that runs the node's real ``async`` code.

trio's MockClock would run it too, but a sleep there costs ~65 µs with a thousand tasks (4 µs
here) and ten thousand virtual nodes make millions of them; this loop drives the same coroutines
with one heap and ``coroutine.send``. The only thing a simulated coroutine may await is a
:class:`Delay` (directly, or through the simulated network, which awaits delays), an
:class:`At`, and :data:`PARK` — "do not resume me until someone calls :meth:`EventLoop.resume_at`".

Events at the same instant run by (priority, creation order), so a seeded run is deterministic.
"""

from __future__ import annotations

import heapq
import math
from typing import Any, Callable, Coroutine

# Priorities for events at the same instant: deliveries before node actions, so a statement
# arriving at t is known to a node acting at t.
DELIVER, ACT = 0, 1


class Delay:
    """Awaitable: resume the awaiting coroutine ``seconds`` of virtual time later."""

    __slots__ = ("seconds",)

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __await__(self):
        yield self


class At:
    """Awaitable: resume the awaiting coroutine at virtual time ``when`` (exactly)."""

    __slots__ = ("when",)

    def __init__(self, when: float) -> None:
        self.when = when

    def __await__(self):
        yield self


class _Park:
    def __await__(self):
        yield self


PARK = _Park()


class Task:
    __slots__ = ("coro", "cancelled", "finished", "on_done")

    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None:
        self.coro = coro
        self.cancelled = False
        self.finished = False
        self.on_done: Callable[[], None] | None = None

    def cancel(self) -> None:
        """Stop the task where it waits (its ``finally`` blocks run now, at the current time)."""
        if not (self.cancelled or self.finished):
            self.cancelled = True
            self.coro.close()


class EventLoop:
    def __init__(self) -> None:
        self.now = 0.0
        self._queue: list[tuple[float, int, int, Callable, Any]] = []
        self._seq = 0
        self.events = 0

    def call_at(self, when: float, fn: Callable[[Any], None], arg: Any = None, priority: int = ACT) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (max(when, self.now), priority, self._seq, fn, arg))

    def spawn(self, coro: Coroutine[Any, Any, Any], at: float | None = None) -> Task:
        task = Task(coro)
        self.call_at(self.now if at is None else at, self._step, task)
        return task

    def resume_at(self, task: Task, when: float) -> None:
        """Resume a task that awaited :data:`PARK`."""
        self.call_at(when, self._step, task)

    def _step(self, task: Task) -> None:
        if task.cancelled or task.finished:
            return
        try:
            op = task.coro.send(None)
        except StopIteration:
            task.finished = True
            if task.on_done is not None:
                task.on_done()
            return
        if op is PARK:
            return
        self._seq += 1
        when = op.when if type(op) is At else self.now + op.seconds
        heapq.heappush(self._queue, (when, ACT, self._seq, self._step, task))

    def run(self, until: float = math.inf, stop: Callable[[], bool] = lambda: False) -> None:
        queue = self._queue
        while queue and not stop():
            when, _, _, fn, arg = queue[0]
            if when > until:
                break
            heapq.heappop(queue)
            self.now = when
            self.events += 1
            fn(arg)
