"""An incremental per-run index of how many attesters each step still wants.

The daemon used to recompute the whole run's coverage and walk every step on every pick:
O(steps) work per pick, which for Open-1B's 80,957 steps is a second or more of CPU per claim.
:class:`DeficitIndex` is updated as statements arrive (O(1) per attestation or claim, O(log n)
per lease that starts or ends) and keeps every step in a priority bucket
(:func:`~open1b.node.planner.bucket_of`), so :func:`~open1b.node.planner.pick` only looks at the
buckets that matter.

The pure :func:`open1b.protocol.coverage` stays the definition: for any set of statements and
any ``now``, the deficits here equal those :func:`open1b.node.planner.candidates` derives from
``coverage()`` (tests/node/test_deficits.py checks this on random inputs). Feed only statements
that validation accepted for this run; the index does not re-check signatures or hashes.

Time only moves forward: :meth:`advance` with an earlier ``now`` than before is ignored, so a
clock stepping back never revives an expired lease here (it would only delay a retake).
"""

from __future__ import annotations

import heapq
from typing import Callable, Iterable

import numpy as np

from open1b.protocol import MATCH, Attestation, Claim

from .planner import StepOrder, StepState, bucket_count, bucket_of, step_deficit

# Called with (step, old bucket, new bucket) whenever a step changes bucket.
BucketListener = Callable[[int, int, int], None]


class DeficitIndex:
    """Deficits of one run's steps as seen by ``me`` (whose own claims never count as busy;
    ``me=None`` counts every claim — an omniscient observer's view)."""

    def __init__(self, steps: int, redundancy: int, *, me: bytes | None = None, now: int = 0,
                 listener: BucketListener | None = None) -> None:
        if steps < 1 or not 1 <= redundancy <= 60:
            raise ValueError("steps must be >= 1 and redundancy in [1, 60]")
        self.steps, self.redundancy, self.me = steps, redundancy, me
        self.now = now
        self.listener = listener
        self._attesters: dict[int, set[bytes]] = {}
        self._disputed: set[int] = set()
        # step -> claimant -> {(issued_at, lease_expiry)}; only leases not yet over
        self._claims: dict[int, dict[bytes, set[tuple[int, int]]]] = {}
        self._timeline: list[tuple[int, int]] = []  # (time a lease starts or ends, step)
        start = bucket_of(redundancy, False, redundancy)
        self._bucket = np.full(steps, start, dtype=np.int8)
        self._deficit = np.full(steps, redundancy, dtype=np.int16)
        self._members: list[set[int]] = [set() for _ in range(bucket_count(redundancy))]
        self._members[start] = set(range(steps))
        self.mine: set[int] = set()  # steps ``me`` attested

    # -- ingest ------------------------------------------------------------------------------
    def add_attestation(self, step: int, signer: bytes, match: bool) -> None:
        if not 0 <= step < self.steps:
            raise ValueError(f"step {step} outside the run's {self.steps} steps")
        attesters = self._attesters.setdefault(step, set())
        changed = signer not in attesters
        attesters.add(signer)
        if not match and step not in self._disputed:
            self._disputed.add(step)
            changed = True
        if signer == self.me:
            self.mine.add(step)
        if changed:
            self._update(step)

    def add_claim(self, step: int, claimant: bytes, issued_at: int, lease_expiry: int) -> None:
        if not 0 <= step < self.steps:
            raise ValueError(f"step {step} outside the run's {self.steps} steps")
        if claimant == self.me or lease_expiry <= self.now or lease_expiry <= issued_at:
            return  # our own claims never make a step busy for us; a lease already over never will
        leases = self._claims.setdefault(step, {}).setdefault(claimant, set())
        if (issued_at, lease_expiry) in leases:
            return
        leases.add((issued_at, lease_expiry))
        if issued_at > self.now:
            heapq.heappush(self._timeline, (issued_at, step))
        heapq.heappush(self._timeline, (lease_expiry, step))
        self._update(step)

    def advance(self, now: int) -> None:
        """Apply every lease start and end up to ``now``."""
        if now <= self.now:
            return
        self.now = now
        touched = set()
        while self._timeline and self._timeline[0][0] <= now:
            touched.add(heapq.heappop(self._timeline)[1])
        for step in sorted(touched):
            self._prune(step)
            self._update(step)

    def _prune(self, step: int) -> None:
        by_claimant = self._claims.get(step)
        if not by_claimant:
            return
        for claimant in list(by_claimant):
            leases = {lease for lease in by_claimant[claimant] if lease[1] > self.now}
            if leases:
                by_claimant[claimant] = leases
            else:
                del by_claimant[claimant]
        if not by_claimant:
            del self._claims[step]

    def _busy(self, step: int) -> list[bytes]:
        now = self.now
        return [c for c, leases in self._claims.get(step, {}).items()
                if any(issued <= now < expiry for issued, expiry in leases)]

    def _update(self, step: int) -> None:
        disputed = step in self._disputed
        deficit = step_deficit(self.redundancy, disputed, self._attesters.get(step, ()), self._busy(step))
        self._deficit[step] = deficit
        new = bucket_of(deficit, disputed, self.redundancy)
        old = int(self._bucket[step])
        if new != old:
            self._bucket[step] = new
            self._members[old].discard(step)
            self._members[new].add(step)
            if self.listener is not None:
                self.listener(step, old, new)

    # -- queries (claims.DeficitView) --------------------------------------------------------
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

    def disputed(self, step: int) -> bool:
        return step in self._disputed

    def attesters(self, step: int) -> frozenset[bytes]:
        return frozenset(self._attesters.get(step, ()))

    def state(self, step: int) -> StepState:
        return StepState(int(self._deficit[step]), step in self._disputed, self.attesters(step))

    def open_count(self) -> int:
        return sum(len(m) for m in self._members[1:])

    def complete(self) -> bool:
        """Every step has at least ``redundancy`` distinct attesters (as ``Coverage.complete``)."""
        return len(self._attesters) == self.steps and all(len(a) >= self.redundancy for a in self._attesters.values())


class RunIndexes:
    """A daemon's indexes and preference orders, one per run: built from its store on first use,
    then kept current by every statement the daemon stores (:meth:`add_attestation`, :meth:`add_claim`).

    ``load(run)`` returns the run's step count, its stored attestations and its live claims.
    """

    def __init__(self, me: bytes, redundancy: int, load: Callable[[bytes], tuple[int, Iterable[Attestation], Iterable[Claim]]],
                 clock: Callable[[], int]) -> None:
        self.me, self.redundancy, self.load, self.clock = me, redundancy, load, clock
        self._indexes: dict[bytes, DeficitIndex] = {}
        self._orders: dict[bytes, StepOrder] = {}

    def index(self, run: bytes) -> DeficitIndex:
        """The run's index, advanced to now."""
        now = self.clock()
        index = self._indexes.get(run)
        if index is None:
            steps, attestations, claims = self.load(run)
            index = DeficitIndex(steps, self.redundancy, me=self.me, now=now)
            for att in attestations:
                index.add_attestation(att.step, att.signer, att.verdict == MATCH)
            for claim in claims:
                index.add_claim(claim.step, claim.claimant, claim.issued_at, claim.lease_expiry)
            self._indexes[run] = index
            self._orders[run] = StepOrder(run, self.me, steps)
        index.advance(now)
        return index

    def order(self, run: bytes) -> StepOrder:
        self.index(run)
        return self._orders[run]

    def add_attestation(self, att: Attestation) -> None:
        index = self._indexes.get(att.run)
        if index is not None:  # not built yet: it will load this one from the store
            index.add_attestation(att.step, att.signer, att.verdict == MATCH)

    def add_claim(self, claim: Claim) -> None:
        index = self._indexes.get(claim.run)
        if index is not None:
            index.add_claim(claim.step, claim.claimant, claim.issued_at, claim.lease_expiry)
