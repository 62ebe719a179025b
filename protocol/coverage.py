"""Coverage: what a set of statements says about each step of a run (docs/protocol.md §8).

``coverage`` is a pure function of (run, attestations, claims, reveals, convictions, now,
redundancy, policy):
two nodes holding the same statements and applying the same policy report the same coverage
whatever order they heard them in. It is written as the numbered steps of the spec's §8.3, each
defined only by the ones before it; the step numbers in the comments are the spec's.

Whose attestations count is a :class:`TrustPolicy`, applied here and never to what is stored
(design invariant 7): ``open`` counts every key, ``allowlist`` only its ``roots``. ``quorum``
(0: off) lets agreeing keys *settle* a step, and then a key that contradicts a settled result or
itself is flagged. Independently of the quorum, a revealed replay witness flags *copiers*: keys
whose match of a step does not bind the witness that another key's match proves it knew. A
flagged key's attestations count nowhere in the run. Claims are hints: any valid live claim
makes a step ``claimed``, whoever signed it. A *conviction* (a fraud proof's verdict, §18.4)
needs no trust and no quorum: it flags the guilty key, and refutes the step when the guilty key is
the publisher's and its trace reaches the published state.

The statements passed in are decoded ones: the spec's step 1 also drops statements that do not
decode (§5.2), which ``X.decode`` refuses before anything reaches this function.
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Mapping

from .claims import is_live
from .convictions import Conviction
from .errors import ProtocolError
from .identity import peer_id_from_public_key
from .messages import MATCH, Attestation, Claim
from .validation import Run, check_attestation, check_claim, check_reveal
from .witness import WitnessReveal, witness_binding

OPEN, ALLOWLIST = "open", "allowlist"
CONTRADICTION, COPIER, FRAUD = "contradiction", "copier", "fraud"  # kinds of flag


class StepStatus(str, enum.Enum):
    UNAUDITED = "unaudited"
    CLAIMED = "claimed"
    VERIFIED = "verified"
    DISPUTED = "disputed"
    REFUTED = "refuted"


@dataclass(frozen=True)
class TrustPolicy:
    """Which keys count (``name``, ``roots``) and how many agreeing keys settle a step (``quorum``)."""

    name: str = OPEN
    roots: frozenset[bytes] = frozenset()
    quorum: int = 0

    def __post_init__(self) -> None:
        if self.name not in (OPEN, ALLOWLIST):
            raise ValueError(f"unknown trust policy {self.name!r} (known: {OPEN}, {ALLOWLIST})")
        if self.quorum != 0 and self.quorum < 2:  # one key cannot confirm itself
            raise ValueError("quorum must be 0 (off) or at least 2")

    def trusts(self, key: bytes) -> bool:
        return self.name == OPEN or key in self.roots


@dataclass(frozen=True)
class Contradiction:
    """Evidence against ``signer``: its signed ``statement`` about ``step`` and a ``conflicting``
    one (the settled result's, or its own other result) — both from the same pre_state with
    different post_states, which one deterministic replay cannot both give. For ``kind`` COPIER,
    ``statement`` is its match whose witness binding fails the revealed W_step, ``conflicting``
    another key's match that binds it, and ``reveal`` the reveal. For ``kind`` FRAUD, ``statement``
    is the fraud proof that convicts it (§18.4) and ``conflicting`` is empty. Values are digests."""

    signer: str
    step: int
    statement: bytes
    conflicting: bytes
    kind: str = CONTRADICTION
    reveal: bytes = b""


@dataclass(frozen=True)
class StepCoverage:
    step: int
    status: StepStatus
    auditors: tuple[str, ...]  # peer IDs that attested a match, sorted
    dissenters: tuple[str, ...]  # peer IDs that attested a mismatch, sorted
    claimants: tuple[str, ...]  # peer IDs holding a live claim, sorted
    evidence: tuple[bytes, ...] = ()  # digests of the counted mismatch attestations, sorted
    devices: tuple[str, ...] = ()  # device classes of the counted matches, sorted
    fraud_proofs: tuple[bytes, ...] = ()  # digests of the proofs convicting the publisher's step, sorted
    tied: bool = False  # no post_state is reported by more counted keys than every other (§10: wants one more)

    @property
    def attesters(self) -> int:
        return len(set(self.auditors) | set(self.dissenters))


@dataclass(frozen=True)
class Coverage:
    run: bytes
    redundancy: int
    steps: tuple[StepCoverage, ...]
    policy: TrustPolicy = TrustPolicy()
    flagged: tuple[Contradiction, ...] = ()  # one per flagged key, sorted by peer ID
    untrusted: tuple[str, ...] = ()  # peer IDs of valid attesters the policy does not count, sorted

    def count(self, status: StepStatus) -> int:
        return sum(1 for s in self.steps if s.status == status)

    @property
    def disputed_steps(self) -> list[int]:
        """Steps some counted auditor reports a mismatch for (status disputed or refuted)."""
        return [s.step for s in self.steps if s.status in (StepStatus.DISPUTED, StepStatus.REFUTED)]

    @property
    def refuted_steps(self) -> list[int]:
        return [s.step for s in self.steps if s.status is StepStatus.REFUTED]

    @property
    def replayed_steps(self) -> list[int]:
        """Steps counted replays decided, either way: verified or refuted. Neither can hide a
        forgery any more, so the escape probability (§8.7) counts them as caught; a disputed step
        is not decided and counts only its spot checks."""
        return [s.step for s in self.steps if s.status in (StepStatus.VERIFIED, StepStatus.REFUTED)]

    @property
    def device_classes(self) -> tuple[str, ...]:  # every class that matched a step, sorted
        return tuple(sorted({d for s in self.steps for d in s.devices}))

    def short_of_classes(self, n: int) -> list[int]:  # `coverage --min-classes n`: docs/protocol.md §10.1
        return [s.step for s in self.steps if len(s.devices) < n]  # a step's distinct classes that matched

    @property
    def complete(self) -> bool:
        """Every step has at least ``redundancy`` distinct attesters."""
        return all(s.attesters >= self.redundancy for s in self.steps)


# Per step: signer -> post_state -> that key's attestations reporting it.
Reports = list[dict[bytes, dict[bytes, list[Attestation]]]]


def coverage(
    manifest: Run,
    attestations: Iterable[Attestation],
    claims: Iterable[Claim] = (),
    *,
    reveals: Iterable[WitnessReveal] = (),
    convictions: Iterable[Conviction] = (),
    now: int = 0,
    redundancy: int = 1,
    policy: TrustPolicy = TrustPolicy(),
) -> Coverage:
    if redundancy < 1:
        raise ValueError("redundancy must be at least 1")
    run = manifest.run_id
    # 1. The statements about this run that pass its rules (§7).
    atts = [a for a in attestations if a.run == run and _ok(check_attestation, a, manifest)]
    live = [c for c in claims if c.run == run and _ok(check_claim, c, manifest) and is_live(c, now)]
    valid_reveals = [r for r in reveals if r.run == run and _ok(check_reveal, r, manifest)]
    proven = sorted({c for c in convictions if c.run == run and c.step < manifest.steps
                     and c.pre_state == manifest.state_hashes[c.step]}, key=lambda c: (c.step, c.proof))
    # 2. Trust: the policy's keys; the others are reported, never counted.
    untrusted = {a.signer for a in atts if not policy.trusts(a.signer)}
    trusted = [a for a in atts if policy.trusts(a.signer)]
    # 3. Revealed steps: W_k (every valid reveal of k carries it) and the lowest reveal digest.
    revealed: dict[int, tuple[bytes, bytes]] = {}
    for r in sorted(valid_reveals, key=lambda r: r.digest, reverse=True):
        revealed[r.step] = (r.witness, r.digest)
    # 4. A match of a revealed step is proven when it binds W_k to its signer, else unbound.
    unbound = {a for a in trusted if a.verdict == MATCH and a.step in revealed
               and a.witness != witness_binding(run, a.step, a.signer, revealed[a.step][0])}
    # 5. Copiers.
    copiers = _copiers(trusted, unbound, revealed)
    # 6. Reports: unbound matches count for nothing from here on.
    reports: Reports = [{} for _ in range(manifest.steps)]
    for a in trusted:
        if a not in unbound:
            reports[a.step].setdefault(a.signer, {}).setdefault(a.post_state, []).append(a)
    # 7-8. Contradictions, against steps settled without the copiers and the convicted keys (only
    # with a quorum).
    convicted = _convicted(proven)
    contradictions = _contradictions(reports, policy.quorum, {**copiers, **convicted}) if policy.quorum else {}
    # 9. Flags: a conviction needs no vote, so it replaces any other flag; a contradiction is the
    # stronger proof of the others, so it replaces a key's copier flag.
    flagged = {**copiers, **contradictions, **convicted}
    # 10-11. Each step, over the counted keys: trusted and not flagged.
    steps = []
    for k in range(manifest.steps):
        published = manifest.state_hashes[k + 1]
        counted = {s: posts for s, posts in reports[k].items() if s not in flagged}
        auditors = [s for s, posts in counted.items() if published in posts]
        dissent = {s: [_lowest(atts) for p, atts in posts.items() if p != published] for s, posts in counted.items()}
        dissent = {s: atts for s, atts in dissent.items() if atts}
        settled = _settled(counted, policy.quorum) if policy.quorum else None
        claimants = {c.claimant for c in live if c.step == k}
        frauds = sorted({c.proof for c in proven if c.step == k and c.guilty == manifest.publisher
                         and c.post_state == published})
        if frauds or (settled is not None and settled != published):
            status = StepStatus.REFUTED
        elif dissent:
            status = StepStatus.DISPUTED
        elif auditors:
            status = StepStatus.VERIFIED
        elif claimants:
            status = StepStatus.CLAIMED
        else:
            status = StepStatus.UNAUDITED
        devices = {a.device for posts in counted.values() for a in posts.get(published, ())}
        steps.append(StepCoverage(k, status, _ids(auditors), _ids(dissent), _ids(claimants),
                                  tuple(sorted(a.digest for atts in dissent.values() for a in atts)),
                                  tuple(sorted(devices)), tuple(frauds), bool(counted) and not _settled(counted, 1)))
    return Coverage(run, redundancy, tuple(steps), policy,
                    tuple(sorted(flagged.values(), key=lambda c: c.signer)), _ids(untrusted))


def _ids(keys: Iterable[bytes]) -> tuple[str, ...]:
    return tuple(sorted(peer_id_from_public_key(k) for k in set(keys)))


def _lowest(atts: Iterable[Attestation]) -> Attestation:
    """The one attestation of several that evidence cites: the lowest digest, whatever arrived first."""
    return min(atts, key=lambda a: a.digest)


def _settled(reports: Mapping[bytes, Mapping[bytes, object]], quorum: int) -> bytes | None:
    """The post_state at least ``quorum`` keys report and more keys report than any other value."""
    ranked = Counter(post for posts in reports.values() for post in posts).most_common(2)
    if not ranked or ranked[0][1] < quorum or (len(ranked) > 1 and ranked[1][1] == ranked[0][1]):
        return None
    return ranked[0][0]


def _cite(backers: list[tuple[bytes, bytes]], flagged: Mapping[bytes, object]) -> bytes:
    """The lowest digest among (digest, key) ``backers`` whose key is not ``flagged``, else the lowest:
    the evidence against a key cites an honest statement wherever the statements allow it."""
    backers = sorted(backers)
    return next((d for d, s in backers if s not in flagged), backers[0][0])


def _convicted(proven: list[Conviction]) -> dict[bytes, Contradiction]:
    """Step 9's convicted keys: each with the proof of its lowest step (the lowest digest there)."""
    found: dict[bytes, Contradiction] = {}
    for c in proven:  # sorted by (step, proof): the first of a key is its flag
        found.setdefault(c.guilty, Contradiction(peer_id_from_public_key(c.guilty), c.step, c.proof, b"", FRAUD))
    return found


def _copiers(trusted: list[Attestation], unbound: set[Attestation], revealed: Mapping[int, tuple[bytes, bytes]]
             ) -> dict[bytes, Contradiction]:
    """Step 5: each key with an unbound match of a revealed step k that another key's proven match
    shows was replayable, with the evidence of its lowest such step."""
    proven: dict[int, dict[bytes, bytes]] = {}  # step -> key -> its lowest proven match's digest
    own: dict[bytes, dict[int, bytes]] = {}  # key -> step -> its lowest unbound match's digest
    for a in trusted:
        if a in unbound:
            own.setdefault(a.signer, {})[a.step] = min(a.digest, own.get(a.signer, {}).get(a.step, a.digest))
        elif a.verdict == MATCH and a.step in revealed:
            proven.setdefault(a.step, {})[a.signer] = min(a.digest, proven.get(a.step, {}).get(a.signer, a.digest))
    found = {}
    for signer, steps in own.items():
        caught = [k for k in sorted(steps) if set(proven.get(k, ())) - {signer}]
        if caught:
            found[signer] = (caught[0], steps[caught[0]])
    return {signer: Contradiction(
        peer_id_from_public_key(signer), k, statement,
        _cite([(d, s) for s, d in proven[k].items() if s != signer], found), COPIER, revealed[k][1])
        for signer, (k, statement) in found.items()}


def _contradictions(reports: Reports, quorum: int, copiers: Mapping[bytes, object]) -> dict[bytes, Contradiction]:
    """Steps 7-8: each key that contradicts a step settled without ``copiers``, or itself, with
    the evidence of its lowest such step."""
    found: dict[bytes, tuple[int, bytes, list[tuple[bytes, bytes]]]] = {}  # key -> step, statement, backers
    for k, by_signer in enumerate(reports):
        lowest = {s: {p: _lowest(atts).digest for p, atts in posts.items()} for s, posts in by_signer.items()}
        settled = _settled({s: posts for s, posts in lowest.items() if s not in copiers}, quorum)
        backers = [(posts[settled], s) for s, posts in lowest.items() if s not in copiers and settled in posts]
        for signer, posts in lowest.items():
            if signer in found:
                continue
            if settled is not None and any(p != settled for p in posts):
                found[signer] = (k, min(d for p, d in posts.items() if p != settled), backers)
            elif len(posts) > 1:
                first, second = sorted(posts.values())[:2]
                found[signer] = (k, first, [(second, signer)])
    return {signer: Contradiction(peer_id_from_public_key(signer), k, statement, _cite(backers, found))
            for signer, (k, statement, backers) in found.items()}


def _ok(check, message, manifest: Run) -> bool:
    try:
        check(message, manifest)
    except ProtocolError:
        return False
    return True
