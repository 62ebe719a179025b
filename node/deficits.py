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
from typing import Callable, Collection, Iterable, Sequence

import numpy as np

from .pace import Pace
from .planner import (
    CLASS_WAIT,
    PACE_WINDOW_S,
    TAIL_MARGIN,
    StepState,
    Tail,
    bucket_count,
    bucket_of,
    step_deficit,
    tied,
    wanted,
)

# Called with (step, old bucket, new bucket) whenever a step changes bucket.
BucketListener = Callable[[int, int, int], None]


class DeficitIndex:
    """Deficits of one run's steps as seen by ``me`` (whose own claims never count as busy;
    ``me=None`` counts every claim — an omniscient observer's view)."""

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
        self.steps, self.redundancy, self.me = steps, redundancy, me
        self.quorum, self.published, self.refuted = quorum, published, frozenset(refuted)
        self.now = now
        self.listener = listener
        # step -> signer -> how many of its attestations of that step are counted: a count, not a
        # set, so that one of them stops counting (remove_attestation) without losing the others
        self._attesters: dict[int, Counter[bytes]] = {}
        self._mismatches: Counter[int] = Counter()  # step -> counted attestations that are not a match
        # step -> post_state -> signer -> its counted attestations reporting it: whether a step ties
        self._posts: dict[int, dict[bytes, Counter[bytes]]] = {}
        # step -> claimant -> {(issued_at, lease_expiry)}; only leases not yet over
        self._claims: dict[int, dict[bytes, set[tuple[int, int]]]] = {}
        self._timeline: list[tuple[int, int]] = []  # (time a lease starts or ends, step)
        start = bucket_of(redundancy, False, redundancy)
        self._bucket = np.full(steps, start, dtype=np.int8)
        self._deficit = np.full(steps, redundancy, dtype=np.int16)
        self._members: list[set[int]] = [set() for _ in range(bucket_count(redundancy))]
        self._members[start] = set(range(steps))
        self.mine: set[int] = set()  # steps ``me`` attested
        # step -> keys that signed an attestation of it that does not count here (flagged,
        # untrusted, disproved): they will not replay the step again, so their claims hold no slot
        self._finished: dict[int, set[bytes]] = {}
        self._matched_by: dict[str, set[int]] = {}  # device class -> steps it matched
        self._class_seen: dict[str, int] = {}  # device class -> when its latest counted match arrived
        self._class_of: dict[bytes, str] = {}  # key -> the device class its latest counted attestation named
        self._arrival: dict[tuple[int, bytes], int] = {}  # (step, counted attester) -> when it arrived
        self._open_replays = steps * redundancy  # sum of the positive deficits
        self._pace = Pace()  # when each counted attester arrived, and the replay time it reported
        # ... and its turnaround: from its earliest claim on the step (ours included) to its
        # attestation, at least its replay time — fetching and loading included (the class wait);
        # per device class, a key's first counted attestation (cold: it carries the run's one-time
        # costs, fetching its shared files and starting a worker) apart from its later ones (warm)
        self._turnaround: dict[str, tuple[Pace, Pace]] = {}  # class -> (cold, warm)
        self._first_claim: dict[tuple[int, bytes], int] = {}  # (step, claimant) -> its earliest claim's issue
        self._expected: dict[tuple[int, bytes], int] = {}  # (step, claimant) -> its claim's expected_done
        self._claimed_as: dict[tuple[int, bytes], str] = {}  # (step, claimant) -> the device class its claim named
        # Steps that wait on live claims alone (_straggling_after), latest first: (-when, step);
        # an entry is stale unless _straggler still maps its step to that time.
        self._straggler: dict[int, int] = {}
        self._late: list[tuple[int, int]] = []

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
            self._pace.arrived((step, signer), arrived, elapsed_s)
            self._arrival[(step, signer)] = arrived
            first = self._first_claim.pop((step, signer), None)
            took = elapsed_s if first is None else max(arrived - first, elapsed_s or 0)
            if device is not None:
                cold, warm = self._turnaround.setdefault(device, (Pace(), Pace()))
                (warm if signer in self._class_of else cold).arrived((step, signer), arrived, took)
        if device is not None:
            self._class_of[signer] = device
        if match and device is not None:
            self._matched_by.setdefault(device, Counter())[step] += 1
            self._class_seen[device] = max(self._class_seen.get(device, arrived), arrived)
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
            del self._arrival[(step, signer)]
            self._pace.left((step, signer))
            for paces in self._turnaround.values():
                for pace in paces:
                    pace.left((step, signer))
            if not attesters:
                del self._attesters[step]
        changed |= stopped
        if match and device is not None:
            matched = self._matched_by[device]
            matched[step] -= 1
            if not matched[step]:
                del matched[step]
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
        first = self._first_claim.get((step, claimant))
        if first is None or issued_at < first:  # our own too: the turnaround of our attestation
            self._first_claim[(step, claimant)] = issued_at
        if claimant == self.me or lease_expiry <= self.now or lease_expiry <= issued_at:
            return  # our own claims never make a step busy for us; a lease already over never will
        if expected_done is not None:
            self._expected[(step, claimant)] = expected_done
        if device is not None:
            self._claimed_as[(step, claimant)] = device
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
                self._expected.pop((step, claimant), None)
                self._claimed_as.pop((step, claimant), None)
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
        deficit = step_deficit(self.redundancy, disputed, self._attesters.get(step, ()), busy,
                               _tied(self._posts.get(step)))
        when = self._straggling_after(step, busy)
        if when != self._straggler.get(step):
            if when is None:
                del self._straggler[step]
            else:
                self._straggler[step] = when
                heapq.heappush(self._late, (-when, step))
        self._open_replays += max(deficit, 0) - max(int(self._deficit[step]), 0)
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
        return StepState(int(self._deficit[step]), self.disputed(step), attesters, _tied(self._posts.get(step)),
                         frozenset(self._finished.get(step, ())) - attesters)

    # -- the tail (planner.StragglerView) and device classes (planner.DiversityView) -----------
    def tail(self) -> Tail:
        pace, typical = self._pace.at(self.now)
        return Tail(self._open_replays, pace, typical)

    def _straggling_after(self, step: int, busy: list[bytes]) -> int | None:
        """When ``step`` would be complete by its live claims' ``expected_done``, if it waits on
        them alone: every attester it still wants is a live claim by a node that has not attested
        (a claim without ``expected_done`` counts as done now), and no more such claims are live
        than it wants — with one more (the speculative slot) taken, nobody may add another: the
        bound. None otherwise."""
        attesters = self._attesters.get(step, ())
        slots = wanted(self.disputed(step), self.redundancy, len(attesters), _tied(self._posts.get(step)))
        need = slots - len(attesters)
        unfinished = [c for c in busy if c not in attesters]
        if need <= 0 or not need <= len(unfinished) <= slots:
            return None
        return sorted(self._expected.get((step, c), 0) for c in unfinished)[need - 1]

    def stragglers(self, after: int, exclude: Collection[int], limit: int) -> list[int]:
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

    def matched_by(self, device: str) -> Collection[int]:
        return self._matched_by.get(device, set())

    def attested_steps(self) -> Collection[int]:
        return self._attesters.keys()

    def class_wait(self, device: str) -> ClassWait:
        """The steps a node of class ``device`` leaves, for now, to another class (docs/protocol.md
        §10.1, the class wait): those whose matches and in-flight replays (live claims, of the
        class the claim names, else the one the claimant's latest attestation named, else
        ``device``'s) are all of class ``device``, while another class that is about as fast
        matched a step within PACE_WINDOW_S; for CLASS_WAIT × that class's median turnaround
        (claim to attestation) after the step's latest attester arrived or its in-flight claim
        was issued. About as fast: its median warm turnaround at most TAIL_MARGIN times this
        class's, or either has no warm one yet — cold ones (a key's first replay of the run) say
        more of the run's start than of a class's speed, and one class may have only cold ones
        while the other has warm (a devnet under load: 40 s against 16 s, for the same CPU).
        :func:`~open1b.node.planner.pick` asks only about a step's last slot."""
        typical = {d: (cold.at(self.now)[1], warm.at(self.now)[1]) for d, (cold, warm) in self._turnaround.items()}
        own = typical.get(device, (None, None))[1]
        # the other classes worth waiting for: live, and about as fast as this one (so the wait
        # costs about a replay of ours at most) — a slower class would take the step later
        others = [warm or cold for d, (cold, warm) in typical.items()
                  if d != device and (warm or cold) and self._class_seen.get(d, -PACE_WINDOW_S) > self.now - PACE_WINDOW_S
                  and (own is None or warm is None or warm <= TAIL_MARGIN * own)]
        return ClassWait(self, device, CLASS_WAIT * min(others) if others else 0.0, blind=not self._class_seen)


class ClassWait:
    """Membership: a step the class wait holds back from ``device`` now. ``held`` tells whether
    any step asked about was held back (a node that found nothing only because of the wait will
    find it once the wait is over: the simulator does not park such a node)."""

    __slots__ = ("index", "device", "wait_s", "blind", "held")

    def __init__(self, index: DeficitIndex, device: str, wait_s: float, blind: bool = False) -> None:
        self.index, self.device, self.wait_s, self.blind, self.held = index, device, wait_s, blind, False

    def __contains__(self, step: object) -> bool:
        index = self.index
        if not (self.blind or self.wait_s):
            return False
        attesters = index._attesters.get(step, ())
        if self.blind and attesters:
            return False
        # Nothing matched yet (the run's first round, blind): the classes in flight are all a node
        # can know, and one that is its own waits until it attests or its lease ends. Else the
        # step's matches and replays in flight, for a while (wait_s).
        classes = {d for d, steps in index._matched_by.items() if step in steps}
        since = max((index._arrival[(step, s)] for s in attesters), default=None)
        for claimant in index._busy(step):
            if claimant not in attesters:  # in flight: the class its claim names, else the one an attestation told
                classes.add(index._claimed_as.get((step, claimant)) or index._class_of.get(claimant, self.device))
                issued = min(i for i, e in index._claims[step][claimant] if i <= index.now < e)
                since = issued if since is None else max(since, issued)
        if classes != {self.device} or (not self.blind and index.now >= since + self.wait_s):
            return False
        self.held = True
        return True


def _tied(posts: dict[bytes, Counter[bytes]] | None) -> bool:
    """Whether a step's counted results tie, from its post_state -> signer counts (planner.tied)."""
    return tied(len(signers) for signers in (posts or {}).values())
