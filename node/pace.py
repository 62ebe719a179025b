"""How fast the network attests, over a sliding window: :class:`Pace`, which the planner's
:class:`~.stragglers.Stragglers` keeps for the whole run (the tail rules, docs/protocol.md §10.1)
and :class:`~.device_classes.DeviceClasses` per device class (the class wait's turnarounds)."""

from __future__ import annotations

import bisect
import heapq

from .planner import PACE_WINDOW_S


class Pace:
    """How fast the network attests, and its typical replay time, over the last PACE_WINDOW_S:
    every counted attester's arrival (step, signer) with the replay time it reported. One that
    stops counting (:meth:`DeficitIndex.remove_attestation`) leaves the pace too, so a flagged
    key's burst never speeds it up."""

    def __init__(self) -> None:
        self._seen: dict[tuple[int, bytes], tuple[int, float | None]] = {}
        self._expiry: list[tuple[int, tuple[int, bytes]]] = []  # (arrival, key): oldest first
        self._times: list[float] = []  # the replay times of _seen, sorted: the median in O(1)

    def arrived(self, key: tuple[int, bytes], at: int, elapsed_s: float | None) -> None:
        self.left(key)
        self._seen[key] = (at, elapsed_s)
        heapq.heappush(self._expiry, (at, key))
        if elapsed_s is not None:
            bisect.insort(self._times, elapsed_s)

    def left(self, key: tuple[int, bytes]) -> None:
        _, elapsed_s = self._seen.pop(key, (None, None))
        if elapsed_s is not None:
            del self._times[bisect.bisect_left(self._times, elapsed_s)]

    def at(self, now: int) -> tuple[float, float | None]:
        """(attestations per second, 0 when none lately; the median replay time, None when unknown)."""
        # pop the arrivals out of the window, and the heads that left or arrived again since
        while self._expiry and (self._expiry[0][0] <= now - PACE_WINDOW_S
                                or self._seen.get(self._expiry[0][1], (None,))[0] != self._expiry[0][0]):
            at, key = heapq.heappop(self._expiry)
            if self._seen.get(key, (None,))[0] == at:
                self.left(key)
        if not self._seen:
            return 0.0, None
        # Until a whole window has passed, the pace is over the time since the first arrival.
        span = min(PACE_WINDOW_S, now - self._expiry[0][0])
        return len(self._seen) / max(span, 60), self._times[len(self._times) // 2] if self._times else None
