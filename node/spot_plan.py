"""Which step to spot check next: pure, like :mod:`.planner` (docs/protocol.md §5.5, §8.7).

A node orders a run's steps by B2 of its challenge signature over each step: an order no one else
can compute before the node signs (unlike :class:`.planner.StepOrder`, which is keyed by public
values, because replays need no secrecy but spot checks do). It takes the steps with the fewest
counted spot checks first, so checks spread over the whole run before any step is checked twice,
and skips the steps it has checked itself (its challenge of a step is always the same one), the
steps replay coverage verified (a replay already catches any forgery) and the steps already failed.
Full replays go where spot checks point: a failed step (``SpotCoverage.failed_steps``) is what
the replay planner takes first (:func:`.planner.pick_first`). The daemon's spot checker
(:mod:`.spot_checker`) plans with these two functions.
"""

from __future__ import annotations

from typing import Iterable

from open1b.protocol import Identity, SpotCoverage, challenge_signature
from open1b.protocol.hashing import blake2b256


def spot_order(identity: Identity, run: bytes, steps: int) -> list[int]:
    """Every step of the run in this key's secret order."""
    return sorted(range(steps), key=lambda k: blake2b256(challenge_signature(identity, run, k)))


def next_spot_checks(order: list[int], spot: SpotCoverage, own: Iterable[int], replayed: Iterable[int],
                     count: int, *, unchecked_only: bool = False) -> list[int]:
    """Up to ``count`` steps to spot check next: fewest counted checks first, then ``order``;
    with ``unchecked_only``, only steps no one has spot checked yet."""
    skip = set(own) | set(replayed) | set(spot.failed_steps)
    checks = {s.step: len(s.checkers) for s in spot.steps}
    rank = {k: i for i, k in enumerate(order)}
    todo = [k for k in order if k not in skip and not (unchecked_only and checks.get(k, 0))]
    return sorted(todo, key=lambda k: (checks.get(k, 0), rank[k]))[:count]

