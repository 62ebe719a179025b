"""Every step of a run in a priority bucket by its deficit (:class:`StepBuckets`): what
:func:`~open1b.node.planner.pick` reads (:class:`~open1b.node.planner.DeficitView`), and the
replays the run still wants in all (the tail rules' ``open_replays``).

It holds placements only; :class:`~.deficits.DeficitIndex` derives each step's deficit from the
statements and places it here whenever it changes.
"""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np

from .planner import bucket_count, bucket_of

# Called with (step, old bucket, new bucket) whenever a step changes bucket.
BucketListener = Callable[[int, int, int], None]


class StepBuckets:
    """Each step's deficit and bucket, the steps of each bucket, and the sum of the positive
    deficits. Every step starts wanting ``redundancy`` attesters, undisputed."""

    def __init__(self, steps: int, redundancy: int, listener: BucketListener | None = None) -> None:
        self.redundancy, self.listener = redundancy, listener
        start = bucket_of(redundancy, False, redundancy)
        self._bucket = np.full(steps, start, dtype=np.int8)
        self._deficit = np.full(steps, redundancy, dtype=np.int16)
        self._members: list[set[int]] = [set() for _ in range(bucket_count(redundancy))]
        self._members[start] = set(range(steps))
        self.open_replays = steps * redundancy  # sum of the positive deficits

    def place(self, step: int, deficit: int, disputed: bool) -> None:
        """``step`` now wants ``deficit`` attesters (net of live claims); the listener hears of a
        change of bucket."""
        self.open_replays += max(deficit, 0) - max(int(self._deficit[step]), 0)
        self._deficit[step] = deficit
        new = bucket_of(deficit, disputed, self.redundancy)
        old = int(self._bucket[step])
        if new != old:
            self._bucket[step] = new
            self._members[old].discard(step)
            self._members[new].add(step)
            if self.listener is not None:
                self.listener(step, old, new)

    # -- planner.DeficitView ---------------------------------------------------------------------
    def open_buckets(self) -> list[int]:
        return [b for b in range(len(self._members) - 1, 0, -1) if self._members[b]]

    def bucket_size(self, bucket: int) -> int:
        return len(self._members[bucket])

    def bucket_members(self, bucket: int) -> Iterable[int]:
        return self._members[bucket]

    def buckets_of(self, steps: np.ndarray) -> np.ndarray:
        return self._bucket[steps]

    def bucket(self, step: int) -> int:
        return int(self._bucket[step])

    def deficit(self, step: int) -> int:
        return int(self._deficit[step])
