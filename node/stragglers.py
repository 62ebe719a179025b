"""The tail rules' record of one run (docs/protocol.md §10.1; :class:`~.planner.StragglerView`):
the pace at which counted attesters arrive, what live claims say of when they will be done, and
the steps that wait on live claims alone, latest first (:class:`Stragglers`).

:class:`~.deficits.DeficitIndex` tells it of every counted attester and live claim, and of each
step's remaining need whenever the step changes.
"""

from __future__ import annotations

import heapq
from typing import Collection, Iterable

from .pace import Pace
from .planner import Tail


class Stragglers:
    def __init__(self) -> None:
        self._pace = Pace()  # when each counted attester arrived, and the replay time it reported
        self._expected: dict[tuple[int, bytes], int] = {}  # (step, claimant) -> its live claim's expected_done
        # Steps that wait on live claims alone (track), latest first: (-when, step); an entry is
        # stale unless _straggler still maps its step to that time.
        self._straggler: dict[int, int] = {}
        self._late: list[tuple[int, int]] = []

    # -- told ------------------------------------------------------------------------------------
    def arrived(self, step: int, signer: bytes, at: int, elapsed_s: float | None) -> None:
        """A counted attester of ``step``, with the replay time it reported."""
        self._pace.arrived((step, signer), at, elapsed_s)

    def left(self, step: int, signer: bytes) -> None:
        """It stopped counting: it leaves the pace, so a flagged key's burst never speeds it up."""
        self._pace.left((step, signer))

    def expect(self, step: int, claimant: bytes, expected_done: int) -> None:
        """A live claim's ``expected_done``."""
        self._expected[(step, claimant)] = expected_done

    def lease_over(self, step: int, claimant: bytes) -> None:
        self._expected.pop((step, claimant), None)

    def track(self, step: int, need: int, slots: int, unfinished: Iterable[bytes]) -> None:
        """``step`` wants ``need`` attesters more of ``slots`` in all; ``unfinished``: the live
        claimants that have not attested it. It waits on them alone when every attester it still
        wants is one of them (a claim without ``expected_done`` counts as done now), and no more
        are live than it wants — with one more (the speculative slot) taken, nobody may add
        another: the bound. It would then be complete at the ``need``-th earliest ``expected_done``."""
        unfinished = list(unfinished)
        when = None
        if need > 0 and need <= len(unfinished) <= slots:
            when = sorted(self._expected.get((step, c), 0) for c in unfinished)[need - 1]
        if when != self._straggler.get(step):
            if when is None:
                del self._straggler[step]
            else:
                self._straggler[step] = when
                heapq.heappush(self._late, (-when, step))

    # -- planner.StragglerView -------------------------------------------------------------------
    def tail(self, open_replays: int, now: int) -> Tail:
        pace, typical = self._pace.at(now)
        return Tail(open_replays, pace, typical)

    def stragglers(self, after: int, exclude: Collection[int], limit: int) -> list[int]:
        """Up to ``limit`` steps not in ``exclude`` that would be complete by their live claims
        only after ``after``, latest first."""
        out: list[int] = []
        kept = []
        while len(out) < limit and self._late and -self._late[0][0] > after:
            neg, step = heapq.heappop(self._late)
            if self._straggler.get(step) != -neg:
                continue  # stale: the step's claims changed since
            kept.append((neg, step))
            if step not in exclude:
                out.append(step)
        for item in kept:
            heapq.heappush(self._late, item)
        return out

    def straggling(self, step: int) -> int | None:
        """When ``step`` would be complete by its live claims, if it waits on them alone."""
        return self._straggler.get(step)
