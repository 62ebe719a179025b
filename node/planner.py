"""Which step to replay next: pure logic, no I/O, no clock (the caller passes ``now``).

Honest nodes spread out *before* they ever race for a claim: every node walks the run's steps in
its own pseudo-random order of preference (:class:`StepOrder`, keyed by the run and the node's
key) and takes the first step that still wants attesters; claims in the DHT then settle the few
races that remain. Deficit comes first: a disputed step before any other, then the steps that
want the most attesters, so the whole run is covered once before any step is covered twice.

Why a per-node order and not a rank among known peers (rendezvous hashing over the peer list):
ranking every step against every peer costs O(steps × peers) per pick, which is minutes of CPU
for Open-1B's 80,957 steps and thousands of peers, and a node only ever knows a few dozen peers
anyway — ranking among a small sample orders steps by the node's own score in all but name. The
own-score order needs no peer list, is stable across restarts, and is what rendezvous ranking
converges to as the network grows.

Two ways to find a node's best steps give the same answer (:func:`pick`): scan the node's
precomputed best-``PREFIX`` steps for members of a large bucket, or score every member of a
small one. So a pick costs O(PREFIX) or O(bucket), never O(steps). The same functions drive the
daemon and the scale simulator (``open1b.sim``), so what is measured there is what runs here.

:func:`candidates` is the slow, obvious reference over a full :class:`~open1b.protocol.Coverage`;
tests check that :func:`pick` over an incremental index (:mod:`.deficits`) agrees with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Collection, Iterable, Mapping, Protocol

import numpy as np

from open1b.protocol import Claim, Coverage, StepStatus, is_live, public_key_from_peer_id, select_claim
from open1b.protocol.hashing import blake2b256

_PREFERENCE_TAG = b"open1b/preference/v1"
_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MIX1, _MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB

# How many of its best steps a node keeps sorted: picks scan these first. 1024 int64 = 8 KiB.
PREFIX = 1024
# Scan the prefix only when it should hold this many times the members we need; else score the
# bucket's members directly (cheaper for small buckets, and exact either way).
_SCAN_MARGIN = 8


# -- preference order ------------------------------------------------------------------------
def preference_key(run: bytes, me: bytes) -> int:
    return int.from_bytes(blake2b256(_PREFERENCE_TAG, run, me)[:8], "little")


def _mix(x: int) -> int:
    # SplitMix64's finaliser: a bijection on 64-bit words in which every input bit flips about
    # half the output bits, so consecutive steps get unrelated scores.
    x = ((x ^ (x >> 30)) * _MIX1) & _M64
    x = ((x ^ (x >> 27)) * _MIX2) & _M64
    return x ^ (x >> 31)


def preference_score(key: int, step: int) -> int:
    """The node's score for ``step`` (lower is preferred). Not a secret and not a security
    property: a node can grind keys to prefer chosen steps, as it could with any public hash."""
    return _mix(key ^ _mix(((step + 1) * _GOLDEN) & _M64))


def _mix_np(x: np.ndarray) -> np.ndarray:
    x = (x ^ (x >> np.uint64(30))) * np.uint64(_MIX1)  # uint64 arithmetic wraps, as in _mix
    x = (x ^ (x >> np.uint64(27))) * np.uint64(_MIX2)
    return x ^ (x >> np.uint64(31))


def preference_scores(key: int, steps: np.ndarray) -> np.ndarray:
    """:func:`preference_score` of every step in ``steps``, vectorised (uint64)."""
    s = (np.asarray(steps, dtype=np.uint64) + np.uint64(1)) * np.uint64(_GOLDEN)
    return _mix_np(np.uint64(key) ^ _mix_np(s))


class StepOrder:
    """One node's order of preference over one run's steps: ascending (score, step).

    Only the best :data:`PREFIX` steps are kept sorted (computed once, O(steps)); anything
    beyond is scored on demand. Score ties need a 64-bit collision, so ties are broken by step
    only for form's sake.
    """

    def __init__(self, run: bytes, me: bytes, steps: int, prefix: int = PREFIX) -> None:
        self.steps = steps
        self.key = preference_key(run, me)
        scores = preference_scores(self.key, np.arange(steps))
        k = min(prefix, steps)
        best = np.argpartition(scores, k - 1)[:k] if k < steps else np.arange(steps)
        self.prefix: np.ndarray = best[np.lexsort((best, scores[best]))].astype(np.int64)

    def score(self, step: int) -> int:
        return preference_score(self.key, step)

    def best(self, steps: Iterable[int], n: int, exclude: Collection[int] = ()) -> list[int]:
        """The ``n`` most preferred of ``steps`` not in ``exclude``, best first (exact)."""
        pool = np.fromiter((s for s in steps if s not in exclude), dtype=np.int64)
        if n <= 0 or pool.size == 0:
            return []
        scores = preference_scores(self.key, pool)
        if pool.size > n:
            keep = np.argpartition(scores, n - 1)[:n]
            pool, scores = pool[keep], scores[keep]
        return [int(s) for s in pool[np.lexsort((pool, scores))]]


# -- deficits --------------------------------------------------------------------------------
def wanted(disputed: bool, redundancy: int, attesters: int = 0, tied: bool = False) -> int:
    """Attesters a step wants: a disputed step wants one independent opinion more, and while its
    counted results are ``tied`` (:func:`tied`) one more than its ``attesters``: a tied step
    settles no quorum, so nobody who contradicts it is ever flagged unless one more replay breaks
    the tie. Bounded: each key attests a step once (docs/protocol.md §10)."""
    if not disputed:
        return redundancy
    return max(redundancy + 1, attesters + 1) if tied else redundancy + 1


def tied(tallies: Iterable[int]) -> bool:
    """Whether no post-state is reported by strictly more keys than every other, given how many
    counted keys report each post-state a step's attestations name."""
    top = sorted((n for n in tallies if n), reverse=True)
    return len(top) > 1 and top[0] == top[1]


def step_deficit(redundancy: int, disputed: bool, attesters: Collection[bytes], busy: Iterable[bytes],
                 tied: bool = False) -> int:
    """Attesters a step still wants: the target, less those who attested (either verdict), less
    the holders of live claims who have not attested yet (``busy``: claimant keys, never our own)."""
    return (wanted(disputed, redundancy, len(attesters), tied) - len(attesters)
            - sum(1 for key in set(busy) if key not in attesters))


def bucket_of(deficit: int, disputed: bool, redundancy: int) -> int:
    """The priority class of a step: 0 when it wants nobody, larger is more urgent — every
    disputed step ranks above every other, and within each group a larger deficit ranks higher."""
    if deficit <= 0:
        return 0
    return deficit + (redundancy + 1 if disputed else 0)


def bucket_count(redundancy: int) -> int:
    return 2 * redundancy + 3


@dataclass(frozen=True)
class StepState:
    deficit: int
    disputed: bool
    attesters: frozenset[bytes]  # keys of those who attested the step, either verdict
    tied: bool = False  # its counted results tie (:func:`tied`)
    # keys that signed an attestation of the step that does not count (flagged, untrusted,
    # disproved): finished with it, so their claims hold no slot, but not attesters
    finished: frozenset[bytes] = frozenset()

    def slots(self, redundancy: int) -> int:
        """Attesters the step wants in all: its claim slots."""
        return wanted(self.disputed, redundancy, len(self.attesters), self.tied)


class DeficitView(Protocol):
    """What :func:`pick` needs to know about one run: a node's incremental index
    (:class:`open1b.node.deficits.DeficitIndex`), or the simulator's per-node view of a shared one."""

    redundancy: int

    def open_buckets(self) -> list[int]:
        """Non-empty buckets other than 0, most urgent first."""

    def bucket_size(self, bucket: int) -> int: ...

    def bucket_members(self, bucket: int) -> Iterable[int]: ...

    def buckets_of(self, steps: np.ndarray) -> np.ndarray:
        """The bucket of every step in ``steps``."""

    def state(self, step: int) -> StepState: ...


@dataclass(frozen=True)
class Candidate:
    step: int
    deficit: int  # attesters still wanted, net of live claims by others
    disputed: bool
    score: int  # this node's preference score for the step (lower first)
    slots: int  # redundancy slots of the step: attesters wanted in all (StepState.slots)
    attesters: frozenset[bytes]
    speculative: bool = False  # a claim on the step's speculative slot (speculative_candidate)
    finished: frozenset[bytes] = frozenset()  # StepState.finished

    def done(self) -> frozenset[bytes]:
        """Keys finished with the step, counted or not: their claims are no longer busy."""
        return self.attesters | self.finished

    def order(self) -> tuple[bool, int, int, int]:
        return (not self.disputed, -self.deficit, self.score, self.step)


def pick(view: DeficitView, order: StepOrder, *, exclude: Collection[int] = frozenset(), limit: int = 4,
         device: str | None = None) -> list[Candidate]:
    """Up to ``limit`` steps this node should try to claim, best first (the order of
    :meth:`Candidate.order`). ``exclude``: steps the node must not take (it attested them, or
    its replay failed).

    With ``device`` (this node's device class, and ``view`` a :class:`DiversityView`), a step's
    second and later replays go preferably to a class that has not matched it yet: within a
    bucket that can hold attested steps, first the steps some *other* class matched, then those
    nobody attested yet (their first replay is in flight, its class unknown), and the steps
    this class already matched last. Tiers only reorder a bucket; but the last slot of a step
    only this class matched is left, for a bounded while, to another class
    (:meth:`DiversityView.class_wait`)."""
    out: list[Candidate] = []
    r = view.redundancy
    for bucket in view.open_buckets():
        need = limit - len(out)
        disputed = bucket > r + 1
        deficit = bucket - (r + 1) if disputed else bucket
        if device is None or deficit >= wanted(disputed, r):
            chosen = _best_in_bucket(view, order, bucket, exclude, need)
        else:
            same, attested = view.matched_by(device), view.attested_steps()  # type: ignore[attr-defined]
            # the last slot of a step only this class matched or replays waits a while for another class
            wait = view.class_wait(device) if deficit == 1 else ()  # type: ignore[attr-defined]
            chosen = []
            for tier in (_Unless(exclude, same, keep=attested, wait=wait), _Unless(exclude, same, wait=wait)):
                chosen += _preferred_in_bucket(view, order, bucket, _Unless(tier, chosen), need - len(chosen))
            if len(chosen) < need:
                chosen += _best_in_bucket(view, order, bucket, _Unless(exclude, chosen, wait=wait), need - len(chosen))
        for step in chosen:
            s = view.state(step)
            out.append(Candidate(step, s.deficit, s.disputed, order.score(step), s.slots(r), s.attesters,
                                 finished=s.finished))
        if len(out) >= limit:
            break
    return out


class DiversityView(DeficitView, Protocol):
    def matched_by(self, device: str) -> Collection[int]:
        """Steps some attester of class ``device`` matched."""

    def attested_steps(self) -> Collection[int]:
        """Steps with at least one attester."""

    def class_wait(self, device: str) -> Collection[int]:
        """Steps whose last slot a node of class ``device`` leaves to another class for now
        (docs/protocol.md §10.1, the class wait)."""


def pick_first(view: DeficitView, order: StepOrder, steps: Iterable[int], *,
               exclude: Collection[int] = frozenset()) -> list[Candidate]:
    """Candidates for ``steps`` that still want attesters (spot checks failed them: a replay
    settles them first, docs/protocol.md §8.7), ahead of whatever :func:`pick` would choose."""
    out = []
    for step in sorted(set(steps) - set(exclude)):
        s = view.state(step)
        if s.deficit > 0:
            out.append(Candidate(step, s.deficit, s.disputed, order.score(step), s.slots(view.redundancy),
                                 s.attesters, finished=s.finished))
    return out


def _best_in_bucket(view: DeficitView, order: StepOrder, bucket: int, exclude: Collection[int], need: int) -> list[int]:
    size = view.bucket_size(bucket)
    if size * len(order.prefix) >= _SCAN_MARGIN * need * order.steps:
        hits = order.prefix[view.buckets_of(order.prefix) == bucket]
        chosen: list[int] = []
        for s in hits.tolist():
            if s not in exclude:
                chosen.append(s)
                if len(chosen) == need:
                    # Every step outside the prefix scores higher than every step in it, so
                    # these are the bucket's best.
                    return chosen
    return order.best(view.bucket_members(bucket), need, exclude)


def _preferred_in_bucket(view: DeficitView, order: StepOrder, bucket: int, exclude: Collection[int], need: int) -> list[int]:
    """The best of a bucket's members not in ``exclude`` among the node's prefix, or among all of
    them if the bucket is no larger than the prefix: a preference costs O(PREFIX) per pick, never
    O(bucket) (a tier can be empty, e.g. when one class did every replay, and scanning a large
    bucket to find that out would dominate the pick)."""
    if need <= 0:
        return []
    if view.bucket_size(bucket) <= len(order.prefix):
        return order.best(view.bucket_members(bucket), need, exclude)
    hits = order.prefix[view.buckets_of(order.prefix) == bucket]
    chosen: list[int] = []
    for s in hits.tolist():  # stop at ``need``: a tier's membership test costs more than the walk
        if s not in exclude:
            chosen.append(s)
            if len(chosen) == need:
                break
    return chosen


def candidates(
    cov: Coverage,
    *,
    me: bytes,
    order: StepOrder,
    attested_by_me: set[int],
    claims_by_step: Mapping[int, list[Claim]],
    now: int,
    signed_by_step: Mapping[int, Collection[bytes]] = {},
) -> list[Candidate]:
    """Every step this node could replay, best first — the O(steps) reference for :func:`pick`.
    ``signed_by_step``: the keys that signed an attestation of a step, counted or not: finished
    with it, so their claims are not busy."""
    out = []
    for s in cov.steps:
        if s.step in attested_by_me:
            continue  # a node never attests the same step twice
        attesters = frozenset(public_key_from_peer_id(p) for p in set(s.auditors) | set(s.dissenters))
        signed = signed_by_step.get(s.step, ())
        busy = [c.claimant for c in claims_by_step.get(s.step, ())
                if is_live(c, now) and c.claimant != me and c.claimant not in signed]
        disputed = s.status is StepStatus.DISPUTED
        deficit = step_deficit(cov.redundancy, disputed, attesters, busy, s.tied)
        if deficit > 0:
            out.append(Candidate(s.step, deficit, disputed, order.score(s.step),
                                 wanted(disputed, cov.redundancy, len(attesters), s.tied), attesters,
                                 finished=frozenset(signed) - attesters))
    return sorted(out, key=Candidate.order)


# -- claim slots -----------------------------------------------------------------------------
def free_slot(records: Mapping[int, Claim | None], slots: int, *, me: bytes, attesters: Collection[bytes], now: int) -> int | None:
    """The redundancy slot where a new claim by ``me`` should go, or None if every slot is taken.

    A slot is usable if it has no record, its lease has expired, it is already ours, or its
    claimant has finished the step (``attesters``: signed an attestation of it, counted or not). Among usable slots, ours comes first, then an
    empty or expired one, and a finished claimant's slot last: within one lease round the
    strict claim order prefers the *earlier* claim, so a claim written over a finished one
    issued in the same round loses until the next round begins.
    """
    best: tuple[int, int] | None = None
    for slot in range(slots):
        rec = records.get(slot)
        if rec is not None and rec.claimant == me:
            rank = 0
        elif rec is None or not is_live(rec, now):
            rank = 1
        elif rec.claimant in attesters:
            rank = 2
        else:
            continue
        if best is None or rank < best[0]:
            best = (rank, slot)
    return None if best is None else best[1]


def winner(claims: list[Claim]) -> Claim:
    return claims[select_claim(claims)]


# -- straggler-aware claiming (docs/protocol.md §10.1, docs/scale.md "The tail") ---------------
# A replay-time estimate follows the node's measured replays with this weight on the newest.
ESTIMATE_WEIGHT = 0.3
# The window over which a node measures the network's pace (attestations per second).
PACE_WINDOW_S = 3600
# A node leaves open work to faster ones, or takes a straggler's step speculatively, only when
# it is this many times faster or slower than what the alternative would take: a margin for
# estimates that are off (replays vary by ±10 % in the simulator) and for nodes of equal speed.
TAIL_MARGIN = 1.5
# The class wait (docs/protocol.md §10.1, r16): the last slot of a step that only one class
# matched waits for another class at most this many typical turnarounds (claim to attestation)
# — long enough for nodes of the other class that are busy now to finish and come round, also
# when they have a backlog of such steps or a loaded machine stretches their cycle: 3 was too
# short in the device-classes devnet under load (a class's backlog of 6 steps on 3 nodes, 55 s
# against a median turnaround of 16 s; one node's cycle 27 s against 8 s), r21.
CLASS_WAIT = 6.0


class ReplayEstimate:
    """How long this node takes to replay one step: an exponentially weighted mean of its
    measured replays (None until the first is measured, so a new node plans like a fast one)."""

    def __init__(self, seconds: float | None = None) -> None:
        self.seconds = seconds

    def update(self, measured_s: float) -> None:
        if self.seconds is None:
            self.seconds = float(measured_s)
        else:
            self.seconds += ESTIMATE_WEIGHT * (measured_s - self.seconds)

    def expected_done(self, now: int) -> int | None:
        """What this node's claims carry as ``expected_done`` when it starts a replay at ``now``."""
        return None if self.seconds is None else now + math.ceil(self.seconds)


@dataclass(frozen=True)
class Tail:
    """What a node knows of the run's end: the replays still unclaimed, how fast the network
    attests (per second, over the last PACE_WINDOW_S; 0 when unknown), and the median replay
    time its attestations reported over that window (``elapsed_ms``; None when unknown)."""

    open_replays: int
    pace: float
    typical_s: float | None

    def deadline(self, now: int) -> float:
        """When a step this node leaves open is expected to be attested by another: once the
        open work ahead of it is claimed at the current pace, plus a typical replay. Infinite
        when either is unknown (nothing attested lately), so that a network of slow nodes alone
        still claims. The median, not the least, replay time: a few attesters that lie about
        their speed cannot move it."""
        if self.typical_s is None or (self.open_replays and self.pace <= 0):
            return math.inf
        return now + (self.open_replays / self.pace if self.open_replays else 0.0) + self.typical_s


def meets_deadline(estimate_s: float | None, tail: Tail, now: int) -> bool:
    """Whether a node whose replay takes ``estimate_s`` should claim open work now: unless it
    would need more than TAIL_MARGIN times the time until the run is expected to be covered
    anyway. Such a node would hold the last steps while faster ones sit idle; it waits instead
    (and claims again once the pace drops, e.g. when the fast nodes leave). A node without an
    estimate always claims."""
    return estimate_s is None or now + estimate_s <= now + TAIL_MARGIN * (tail.deadline(now) - now)


def speculate_after(estimate_s: float, now: int) -> int:
    """An idle node may take the speculative slot of a step whose holder expects to be done
    after this: it would finish sooner even if its replay took TAIL_MARGIN times its estimate."""
    return now + math.ceil(TAIL_MARGIN * estimate_s)


def speculative_candidate(view: "StragglerView", step: int) -> Candidate:
    """A claim on ``step`` beyond the slots it wants: one slot more, which
    :meth:`ClaimAgent.try_claim <open1b.node.claim_records.ClaimAgent.try_claim>` takes while
    fewer live claims than slots are unfinished (a slot whose claimant attested is free again) —
    so at most one speculative replay runs per step at a time."""
    s = view.state(step)
    return Candidate(step, s.deficit, s.disputed, 0, s.slots(view.redundancy) + 1, s.attesters, True, s.finished)


class StragglerView(DeficitView, Protocol):
    def tail(self) -> Tail: ...

    def stragglers(self, after: int, exclude: Collection[int], limit: int) -> list[int]:
        """Up to ``limit`` steps not in ``exclude`` that wait on live claims only, no more of
        them than the step wants, and would not be complete before ``after`` by the claims'
        ``expected_done``: latest first."""


# -- hardware diversity --------------------------------------------------------------------------
class _Unless:
    """Membership in ``exclude`` or ``also`` or ``wait``, or not in ``keep`` (for the tiers of :func:`pick`)."""

    __slots__ = ("exclude", "keep", "also", "wait")

    def __init__(self, exclude: Collection[int], also: Collection[int] = (), keep: Collection[int] | None = None,
                 wait: Collection[int] = ()) -> None:
        self.exclude, self.also, self.keep, self.wait = exclude, also, keep, wait

    def __contains__(self, step: object) -> bool:
        return (step in self.exclude or step in self.also or (self.keep is not None and step not in self.keep)
                or step in self.wait)


def plan(view: DeficitView, order: StepOrder, *, now: int, exclude: Collection[int] = frozenset(), limit: int = 4,
         device: str | None = None, estimate_s: float | None = None, tail: bool = True) -> list[Candidate]:
    """What the daemon and the simulator both ask: :func:`pick`, under the tail rules when
    ``tail`` (and ``view`` is a :class:`StragglerView`): nothing unless this node meets the
    deadline (:func:`meets_deadline`); then open work, or if there is none for it, the
    speculative slots of the latest stragglers it would beat (:func:`speculate_after`)."""
    tail_of = getattr(view, "tail", None) if tail else None
    if tail_of is None:
        return pick(view, order, exclude=exclude, limit=limit, device=device)
    if not meets_deadline(estimate_s, tail_of(), now):
        return []  # faster nodes will take the open work and the stragglers sooner
    cands = pick(view, order, exclude=exclude, limit=limit, device=device)
    if cands or estimate_s is None:
        return cands
    late = view.stragglers(  # type: ignore[attr-defined]
        speculate_after(estimate_s, now), exclude, limit)
    return [speculative_candidate(view, step) for step in late]
