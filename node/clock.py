"""The node's sense of time, passed to every component instead of read from globals.

Two times, kept apart on purpose:

* ``now()`` and ``sleep()`` — trio's clock, for waiting and measuring. A test that runs the node on
  ``trio.testing.MockClock(autojump_threshold=0)`` skips every wait: hours of leases in milliseconds.
* ``wall()`` — whole seconds since the epoch, for what the node *signs* (``issued_at``, lease
  expiries) and judges (a statement from the future). Their meaning is wall-clock time on the
  wire; a clock made with ``wall_at_zero`` derives them from trio's clock instead, so that under
  a mock clock the signed times move with the virtual ones.
"""

from __future__ import annotations

import time

import trio


class Clock:
    def __init__(self, *, wall_at_zero: float | None = None) -> None:
        """``wall_at_zero``: None for the real wall clock; else the wall time at trio time 0 (tests)."""
        self._wall_at_zero = wall_at_zero

    def now(self) -> float:
        """trio's clock (only inside ``trio.run``)."""
        return trio.current_time()

    def wall(self) -> int:
        """Wall-clock seconds, as signed statements carry them."""
        return self.wall_ms() // 1000

    def wall_ms(self) -> int:
        """Wall-clock milliseconds (when a statement arrived, for the record)."""
        if self._wall_at_zero is None:
            return int(time.time() * 1000)
        elapsed = trio.current_time() if trio.lowlevel.in_trio_run() else 0.0  # before the run starts: time 0
        return int((self._wall_at_zero + elapsed) * 1000)

    async def sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)
