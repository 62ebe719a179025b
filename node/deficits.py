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
from collections import Counter
from typing import Collection, Iterator, Sequence

from .device_classes import ClassWait, DeviceClasses
from .planner import StepState, Tail, step_deficit, tied, wanted
from .step_buckets import BucketListener, StepBuckets
from .stragglers import Stragglers


class DeficitIndex(StepBuckets):
    """Deficits of one run's steps as seen by ``me`` (whose own claims never count as busy;
    ``me=None`` counts every claim — an omniscient observer's view).

    It keeps what counts for each step (attesters, their results, live claims) and places the
    step in its bucket (:class:`~.step_buckets.StepBuckets`); it tells the tail rules'
    :class:`~.stragglers.Stragglers` and the :class:`~.device_classes.DeviceClasses` what they
    keep of the same statements, and answers the planner's questions about both."""

    def __init__(self, steps: int, redundancy: int, *, me: bytes | None = None, now: int = 0,
                 listener: BucketListener | None = None, quorum: int = 0, published: Sequence[bytes] = (),
                 refuted: Collection[int] = ()) -> None:
        """``quorum`` (the trust policy's) and ``published`` (h_1 … h_steps, the run's post-states):
        which steps the counted keys refute (docs/protocol.md §8.3); ``refuted``: the steps a stored
        fraud proof refutes (it convicts the publisher of the published state)."""
        if steps < 1 or not 1 <= redundancy <= 60:
            raise ValueError("steps must be >= 1 and redundancy in [1, 60]")
        if quorum and len(published) != steps:
            raise ValueError("a quorum needs the run's published post-states")
        super().__init__(steps, redundancy, listener)
        self.steps, self.me = steps, me
        self.quorum, self.published, self.refuted = quorum, published, frozenset(refuted)
        self.now = now
        # step -> signer -> how many of its attestations of that step are counted: a count, not a
        # set, so that one of them stops counting (remove_attestation) without losing the others
        self._attesters: dict[int, Counter[bytes]] = {}
        self._mismatches: Counter[int] = Counter()  # step -> counted attestations that are not a match
        # step -> post_state -> signer -> its counted attestations reporting it: whether a step ties
        self._posts: dict[int, dict[bytes, Counter[bytes]]] = {}
        # step -> claimant -> {(issued_at, lease_expiry)}; only leases not yet over
        self._claims: dict[int, dict[bytes, set[tuple[int, int]]]] = {}
        self._timeline: list[tuple[int, int]] = []  # (time a lease starts or ends, step)
        self.mine: set[int] = set()  # steps ``me`` attested
        # step -> keys that signed an attestation of it that does not count here (flagged,
        # untrusted, disproved): they will not replay the step again, so their claims hold no slot
        self._finished: dict[int, set[bytes]] = {}
        self._stragglers = Stragglers()
        self._classes = DeviceClasses()

    # -- ingest ------------------------------------------------------------------------------
    def add_attestation(self, step: int, signer: bytes, match: bool, device: str | None = None,
                        elapsed_s: float | None = None, at: int | None = None, *, post_state: bytes) -> None:
        """``device`` and ``elapsed_s``: the attestation's device class and replay time, for the class
        preference and the tail rules; ``at``: when it was issued (arrivals count at ``now`` or
        earlier, so an index built from the store on restart sees the pace the network had);
        ``post_state``: what it reports, for the tie rule (planner.wanted)."""
        if not 0 <= step < self.steps:
            raise ValueError(f"step {step} outside the run's {self.steps} steps")
        attesters = self._attesters.setdefault(step, Counter())
        changed = signer not in attesters
        attesters[signer] += 1
        arrived = self.now if at is None else min(at, self.now)
        if changed:
            self._stragglers.arrived(step, signer, arrived, elapsed_s)
        self._classes.attested(step, signer, match, device, arrived, elapsed_s, first=changed)
        if not match:
            changed |= not self._mismatches[step]
            self._mismatches[step] += 1
        if signer == self.me:
            self.mine.add(step)
        reporting = self._posts.setdefault(step, {}).setdefault(post_state, Counter())
        changed |= not reporting[signer]  # a new key reports post_state: the step's tallies changed
        reporting[signer] += 1
        if changed:
            self._update(step)

    def add_uncounted(self, step: int, signer: bytes) -> None:
        """``signer`` signed an attestation of ``step`` that is not counted: it is finished with the
        step (a node never attests a step twice), so its live claim makes the step busy no longer —
        else an uncounted signature would hold a slot until its lease ran out. It still counts
        for nothing."""
        if not 0 <= step < self.steps:
            raise ValueError(f"step {step} outside the run's {self.steps} steps")
        finished = self._finished.setdefault(step, set())
        if signer not in finished:
            finished.add(signer)
            if signer in self._claims.get(step, ()):
                self._update(step)

    def remove_attestation(self, step: int, signer: bytes, match: bool, device: str | None = None, *,
                           post_state: bytes) -> None:
        """One attestation added before stops counting (its key was flagged, a reveal disproves it,
        trust in its key was lost). Our own are never removed: ``mine`` keeps the step."""
        attesters = self._attesters.get(step)
        posts = self._posts.get(step, {})
        if attesters is None or not attesters[signer] or not posts.get(post_state, Counter())[signer]:
            raise ValueError(f"no counted attestation of step {step} by that signer to remove")
        reporting = posts[post_state]
        reporting[signer] -= 1
        stopped = not reporting[signer]  # the signer no longer reports post_state: the step's tallies changed
        if stopped:
            del reporting[signer]
            if not reporting:
                del posts[post_state]
                if not posts:
                    del self._posts[step]
        attesters[signer] -= 1
        changed = not attesters[signer]
        if changed:
            del attesters[signer]
            self._stragglers.left(step, signer)
            if not attesters:
                del self._attesters[step]
        self._classes.unattested(step, signer, match, device, last=changed)
        changed |= stopped
        if not match:
            self._mismatches[step] -= 1
            if not self._mismatches[step]:
                del self._mismatches[step]
                changed = True
        if changed:
            self._update(step)

    def add_claim(self, step: int, claimant: bytes, issued_at: int, lease_expiry: int,
                  expected_done: int | None = None, device: str | None = None) -> None:
        """``expected_done`` and ``device``: what the claim says of when its claimant expects to
        attest and of the class it replays on (docs/protocol.md §10.1), for the tail rules and the
        class wait."""
        if not 0 <= step < self.steps:
            raise ValueError(f"step {step} outside the run's {self.steps} steps")
        self._classes.claimed(step, claimant, issued_at)  # our own too: the turnaround of our attestation
        if claimant == self.me or lease_expiry <= self.now or lease_expiry <= issued_at:
            return  # our own claims never make a step busy for us; a lease already over never will
        if expected_done is not None:
            self._stragglers.expect(step, claimant, expected_done)
        if device is not None:
            self._classes.claimed_as(step, claimant, device)
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
                self._stragglers.lease_over(step, claimant)
                self._classes.lease_over(step, claimant)
        if not by_claimant:
            del self._claims[step]

    def _busy(self, step: int) -> list[bytes]:
        now = self.now
        finished = self._finished.get(step, ())
        return [c for c, leases in self._claims.get(step, {}).items()
                if c not in finished and any(issued <= now < expiry for issued, expiry in leases)]

    def _update(self, step: int) -> None:
        disputed = self.disputed(step)
        busy = self._busy(step)
        attesters = self._attesters.get(step, ())
        ties = _tied(self._posts.get(step))
        slots = wanted(disputed, self.redundancy, len(attesters), ties)
        self._stragglers.track(step, slots - len(attesters), slots, [c for c in busy if c not in attesters])
        self.place(step, step_deficit(self.redundancy, disputed, attesters, busy, ties), disputed)

    # -- queries (planner.DeficitView, with the buckets) ---------------------------------------
    def disputed(self, step: int) -> bool:
        """A counted key reports a mismatch and the step is not refuted (its status `disputed`,
        docs/protocol.md §8.3, as :func:`~open1b.node.planner.candidates` reads it): a refuted
        step is settled and wants R attesters, not one opinion more ahead of every other step."""
        if step not in self._mismatches or step in self.refuted:
            return False
        if not self.quorum:
            return True
        tallies = sorted(((len(keys), post) for post, keys in self._posts.get(step, {}).items()), reverse=True)
        settled = tallies[0][0] >= self.quorum and (len(tallies) == 1 or tallies[1][0] < tallies[0][0])
        return not settled or tallies[0][1] == self.published[step]

    def attesters(self, step: int) -> frozenset[bytes]:
        return frozenset(self._attesters.get(step, ()))

    def state(self, step: int) -> StepState:
        attesters = self.attesters(step)
        return StepState(self.deficit(step), self.disputed(step), attesters, _tied(self._posts.get(step)),
                         frozenset(self._finished.get(step, ())) - attesters)

    def in_flight(self, step: int) -> Iterator[tuple[bytes, int]]:
        """(claimant, when its live claim was issued) for each live claimant that has not attested
        ``step`` (the class wait's replays in flight)."""
        attesters = self._attesters.get(step, ())
        for claimant in self._busy(step):
            if claimant not in attesters:
                yield claimant, min(i for i, e in self._claims[step][claimant] if i <= self.now < e)

    # -- the tail (planner.StragglerView) and device classes (planner.DiversityView) -----------
    def tail(self) -> Tail:
        return self._stragglers.tail(self.open_replays, self.now)

    def stragglers(self, after: int, exclude: Collection[int], limit: int) -> list[int]:
        return self._stragglers.stragglers(after, exclude, limit)

    def straggling(self, step: int) -> int | None:
        """When ``step`` would be complete by its live claims, if it waits on them alone."""
        return self._stragglers.straggling(step)

    def matched_by(self, device: str) -> Collection[int]:
        return self._classes.matched_by(device)

    def attested_steps(self) -> Collection[int]:
        return self._attesters.keys()

    def class_wait(self, device: str) -> ClassWait:
        """The steps the class wait holds back from a node of class ``device`` now
        (:meth:`~.device_classes.DeviceClasses.wait`)."""
        return self._classes.wait(self, device)


def _tied(posts: dict[bytes, Counter[bytes]] | None) -> bool:
    """Whether a step's counted results tie, from its post_state -> signer counts (planner.tied)."""
    return tied(len(signers) for signers in (posts or {}).values())
