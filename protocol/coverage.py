"""Coverage: what a set of attestations says about each step of a run.

``coverage`` is a pure function of (run, attestations, claims, reveals, now, redundancy, policy): two
nodes holding the same statements and applying the same policy report the same coverage
whatever order they heard them in. Attestations that are inconsistent with the run are not
counted (validation already keeps them out of stores; coverage re-checks so that it is safe on
any input set).

Whose attestations count is a :class:`TrustPolicy`, applied here and never to what is stored
(design invariant 7):

* ``open`` counts every distinct key; ``allowlist`` counts only the policy's ``roots`` (keys an
  operator trusts). Keys the policy does not count are reported as ``untrusted``.
* ``quorum`` (0 turns it off) *settles* a step: when at least ``quorum`` keys report the same
  post_state and more keys report it than any other value, that is the step's result. Replay is
  deterministic, so a key that reported another value for a settled step, or two values for one
  step, is *flagged* with two conflicting signed statements as evidence, and none of its
  attestations count.
* Whatever the quorum, a key's ``match`` of a step with a valid reveal whose witness binding
  fails the revealed W_k does not count for that step; the key is flagged a ``copier`` when
  another counted key's match binds W_k: it signed a result without knowing what only a replay
  yields (docs/run-format.md §5). The evidence is its attestation, that other key's, and the
  reveal. Copiers' reports never help
  settle a step; a copier that also contradicts a settled result carries that evidence instead.
  A ``mismatch`` is never judged by its binding: an honest replay of a step the trainer forged
  may compute another witness.

Status of a step, first rule that applies (counting only trusted, unflagged keys):

* ``refuted``   — the settled result differs from the published h_{step+1}: independent replays
  confirm the mismatch;
* ``disputed``  — at least one auditor reports a mismatch;
* ``verified``  — at least one auditor reports a match;
* ``claimed``   — someone holds a live claim on it;
* ``unaudited`` — none of the above.

The default policy (``open``, quorum 0) is protocol r2's coverage: every key counts, nothing is
settled or flagged. A step *meets the target* when its counted attesters (either verdict)
reach the requested redundancy.
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Mapping

from .claims import is_live
from .errors import ProtocolError
from .identity import peer_id_from_public_key
from .messages import MATCH, Attestation, Claim
from .validation import Run, check_attestation, check_claim, check_reveal
from .witness import WitnessReveal, witness_binding

OPEN, ALLOWLIST = "open", "allowlist"
CONTRADICTION, COPIER = "contradiction", "copier"  # kinds of flag


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
    another key's match that binds it, and ``reveal`` the reveal. Values are digests."""

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
    def complete(self) -> bool:
        """Every step has at least ``redundancy`` distinct attesters."""
        return all(s.attesters >= self.redundancy for s in self.steps)


# Per step: signer -> post_state -> its attestation with the lowest digest (any would do; the
# lowest makes the evidence chosen independent of arrival order).
Reports = list[dict[bytes, dict[bytes, Attestation]]]


def coverage(
    manifest: Run,
    attestations: Iterable[Attestation],
    claims: Iterable[Claim] = (),
    *,
    reveals: Iterable[WitnessReveal] = (),
    now: int = 0,
    redundancy: int = 1,
    policy: TrustPolicy = TrustPolicy(),
) -> Coverage:
    if redundancy < 1:
        raise ValueError("redundancy must be at least 1")
    reports: Reports = [{} for _ in range(manifest.steps)]
    matches: list[list[Attestation]] = [[] for _ in range(manifest.steps)]
    untrusted: set[bytes] = set()
    for att in attestations:
        if att.run != manifest.run_id or not _ok(check_attestation, att, manifest):
            continue
        if not policy.trusts(att.signer):
            untrusted.add(att.signer)
            continue
        if att.verdict == MATCH:
            matches[att.step].append(att)
        by_post = reports[att.step].setdefault(att.signer, {})
        held = by_post.get(att.post_state)
        if held is None or att.digest < held.digest:
            by_post[att.post_state] = att
    copiers, unproven = _copiers(manifest.run_id, matches, _revealed(manifest, reveals))
    for step, signer in unproven:  # a match the step's revealed witness disproves counts for nothing
        posts = reports[step][signer]
        del posts[manifest.state_hashes[step + 1]]
        if not posts:
            del reports[step][signer]
    flagged = {**copiers, **(_contradictions(reports, policy.quorum, copiers) if policy.quorum else {})}
    live: list[set[bytes]] = [set() for _ in range(manifest.steps)]
    for claim in claims:
        if claim.run == manifest.run_id and is_live(claim, now) and _ok(check_claim, claim, manifest):
            live[claim.step].add(claim.claimant)

    steps = []
    for k in range(manifest.steps):
        published = manifest.state_hashes[k + 1]
        counted = {s: posts for s, posts in reports[k].items() if s not in flagged}
        matches = {s for s, posts in counted.items() if published in posts}
        wrong = {s: [a for p, a in posts.items() if p != published] for s, posts in counted.items()}
        dissent = [a for atts in wrong.values() for a in atts]
        settled = _settled(counted, policy.quorum) if policy.quorum else None
        if settled is not None and settled != published:
            status = StepStatus.REFUTED
        elif dissent:
            status = StepStatus.DISPUTED
        elif matches:
            status = StepStatus.VERIFIED
        elif live[k]:
            status = StepStatus.CLAIMED
        else:
            status = StepStatus.UNAUDITED
        steps.append(StepCoverage(k, status, _ids(matches), _ids(s for s, atts in wrong.items() if atts),
                                  _ids(live[k]), tuple(sorted(a.digest for a in dissent))))
    return Coverage(manifest.run_id, redundancy, tuple(steps), policy,
                    tuple(sorted(flagged.values(), key=lambda c: c.signer)), _ids(untrusted))


def _ids(keys: Iterable[bytes]) -> tuple[str, ...]:
    return tuple(sorted(peer_id_from_public_key(k) for k in set(keys)))


def _settled(reports: Mapping[bytes, Mapping[bytes, Attestation]], quorum: int) -> bytes | None:
    """The post_state at least ``quorum`` keys report and more keys report than any other value."""
    ranked = Counter(post for posts in reports.values() for post in posts).most_common(2)
    if not ranked or ranked[0][1] < quorum or (len(ranked) > 1 and ranked[1][1] == ranked[0][1]):
        return None
    return ranked[0][0]


def _contradictions(reports: Reports, quorum: int, copiers: Mapping[bytes, object]) -> dict[bytes, Contradiction]:
    """Each key that contradicts a settled result (settled without ``copiers``) or itself, with the
    evidence at its lowest such step. The settled result is cited from a key that is not flagged
    itself when there is one, so the evidence against a liar is an honest statement wherever the
    statements allow it."""
    found: dict[bytes, tuple[int, bytes, list[tuple[bytes, bytes]]]] = {}  # signer -> step, own, backers
    for step, by_signer in enumerate(reports):
        voters = {s: posts for s, posts in by_signer.items() if s not in copiers}
        settled = _settled(voters, quorum)
        backing = sorted((posts[settled].digest, s) for s, posts in voters.items() if settled in posts)
        for signer, posts in by_signer.items():
            if signer in found:
                continue
            if settled is not None and any(p != settled for p in posts):
                found[signer] = (step, min(a.digest for p, a in posts.items() if p != settled), backing)
            elif len(posts) > 1:
                first, second = sorted(a.digest for a in posts.values())[:2]
                found[signer] = (step, first, [(second, signer)])
    out = {}
    for signer, (step, statement, backers) in found.items():
        conflicting = next((d for d, s in backers if s not in found), backers[0][0])
        out[signer] = Contradiction(peer_id_from_public_key(signer), step, statement, conflicting)
    return out


def _revealed(manifest: Run, reveals: Iterable[WitnessReveal]) -> dict[int, tuple[bytes, bytes]]:
    """Step -> (W_step, the lowest digest among its valid reveals; all of them carry one witness)."""
    out: dict[int, tuple[bytes, bytes]] = {}
    for r in reveals:
        if r.run == manifest.run_id and _ok(check_reveal, r, manifest):
            if r.step not in out or r.digest < out[r.step][1]:
                out[r.step] = (r.witness, r.digest)
    return out


def _copiers(run: bytes, matches: list[list[Attestation]], revealed: dict[int, tuple[bytes, bytes]]
             ) -> tuple[dict[bytes, Contradiction], list[tuple[int, bytes]]]:
    """Each key with a match whose binding fails a revealed W_k that another key's match binds, with
    the evidence at its lowest such step (lowest digests; the binding match is cited from a key
    that is not a copier itself when there is one); and the (step, key) whose matches of a
    revealed step all fail its binding (*unproven*, flagged or not)."""
    found: dict[bytes, tuple[int, bytes, list[tuple[bytes, bytes]], bytes]] = {}
    unproven = []
    for step in sorted(revealed):
        witness, reveal = revealed[step]
        knew: dict[bytes, bytes] = {}  # signer -> lowest digest, of matches that bind W_step / that do not
        did_not: dict[bytes, bytes] = {}
        for att in matches[step]:
            side = knew if att.witness == witness_binding(run, step, att.signer, witness) else did_not
            side[att.signer] = min(att.digest, side.get(att.signer, att.digest))
        unproven += [(step, signer) for signer in did_not if signer not in knew]
        for signer, own in did_not.items():
            backers = sorted((d, s) for s, d in knew.items() if s != signer)
            if signer not in found and backers:
                found[signer] = (step, own, backers, reveal)
    out = {}
    for signer, (step, own, backers, reveal) in found.items():
        conflicting = next((d for d, s in backers if s not in found), backers[0][0])
        out[signer] = Contradiction(peer_id_from_public_key(signer), step, own, conflicting, COPIER, reveal)
    return out, unproven


def _ok(check, message, manifest: Run) -> bool:
    try:
        check(message, manifest)
    except ProtocolError:
        return False
    return True
