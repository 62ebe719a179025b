"""Earned trust (docs/protocol.md §8.1.1): which keys a node adds to its policy's ``roots`` because
they have proven, on steps its own roots also replayed, that they replay.

Coverage stays a pure function of statements and policy; this module only chooses the policy's
roots, from what the node's store holds and in what order it arrived. The order is the point: a
match that binds a step's witness W_k and reached this node before any reveal of W_k was signed by
someone who knew W_k without being told by a reveal — it replayed the step, or the run's publisher
told it, hence the publisher condition. Nothing here is kept between calls: the daemon recomputes
it from the store whenever statements arrive (node/judge.py), so earning, and losing it on a
flag, take effect without a restart.

:func:`earned_keys` is pure (tests drive it with statements and receipt sequences);
:func:`evidence_from_store` reads its inputs from a :class:`~.store.Store`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from open1b.protocol import (
    MATCH,
    Attestation,
    Conviction,
    RunManifest,
    TrustPolicy,
    WitnessReveal,
    coverage,
    peer_id_from_public_key,
)
from open1b.protocol.coverage import ALLOWLIST
from open1b.protocol.witness import witness_binding

from .store import Store


@dataclass(frozen=True)
class EarnRule:
    """``matches``: k, the proven pairs a key needs; ``publishers``: P, how many distinct
    publishers those pairs must span unless one of their runs was published by a root."""

    matches: int = 3
    publishers: int = 2


@dataclass(frozen=True)
class RunEvidence:
    """What the store holds about one run. ``attestations`` carry their receipt sequence;
    ``reveals`` the sequence of the last attestation stored before each; ``own_witnesses`` are
    W_k from this node's own replays (checked against the manifest's C_k, never gossiped);
    ``convictions`` those of the fraud proofs the node keeps of the run (§18.4)."""

    manifest: RunManifest
    attestations: Sequence[tuple[Attestation, int]]
    reveals: Sequence[tuple[WitnessReveal, int]] = ()
    own_witnesses: Mapping[int, bytes] = field(default_factory=dict)
    convictions: Sequence[Conviction] = ()


@dataclass(frozen=True, order=True)
class Pair:
    """One (run, step) on which a key's proven match agreed with a root's; ``publisher`` is the run's."""

    run: bytes
    step: int
    publisher: bytes


def _qualifying(ev: RunEvidence, roots: frozenset[bytes]) -> dict[bytes, set[int]]:
    """Per key that is not a root, the steps of this run that satisfy conditions 1–3 of docs/protocol.md §8.1.1."""
    run, publisher = ev.manifest.run_id, ev.manifest.publisher
    witness = {r.step: r.witness for r, _ in ev.reveals}
    witness.update(ev.own_witnesses)  # ours opened C_k, as every valid reveal does: the same W_k
    first_reveal: dict[int, int] = {}
    for r, before in ev.reveals:
        first_reveal[r.step] = min(before, first_reveal.get(r.step, before))

    def proven(att: Attestation) -> bool:
        w = witness.get(att.step)
        return att.verdict == MATCH and w is not None and att.witness == witness_binding(run, att.step, att.signer, w)

    rooted: dict[int, set[bytes]] = defaultdict(set)  # step -> post_states a root proved
    for att, _ in ev.attestations:
        if att.signer in roots and proven(att):
            rooted[att.step].add(att.post_state)
    out: dict[bytes, set[int]] = defaultdict(set)
    for att, seq in ev.attestations:
        if att.signer in roots or att.signer == publisher or not proven(att):
            continue
        # 2. stored before the first reveal of the step: a later match may be a copy of it
        if att.step in first_reveal and seq > first_reveal[att.step]:
            continue
        # 3. a root proved the same step with the same post_state
        if att.post_state in rooted.get(att.step, ()):
            out[att.signer].add(att.step)
    return out


def _disqualified(key: bytes, ev: RunEvidence, roots: frozenset[bytes], quorum: int) -> bool:
    """``key`` is flagged in this run were it counted (§8.3 with ``key`` among the roots), or it
    reported a post_state for a step that a root reported otherwise (one of them signed a false
    result, and the node believes its roots), or it signed a match binding another witness than
    the W_k this node computed itself (a copy, whether or not anyone revealed W_k), or a fraud
    proof convicts it (coverage flags it: no vote needed)."""
    root_posts: dict[int, set[bytes]] = defaultdict(set)
    for att, _ in ev.attestations:
        if att.signer in roots:
            root_posts[att.step].add(att.post_state)
    run = ev.manifest.run_id
    for att, _ in ev.attestations:
        if att.signer != key:
            continue
        if root_posts.get(att.step, {att.post_state}) != {att.post_state}:
            return True
        own = ev.own_witnesses.get(att.step)
        if att.verdict == MATCH and own is not None and att.witness != witness_binding(run, att.step, key, own):
            return True
    cov = coverage(ev.manifest, [a for a, _ in ev.attestations], reveals=[r for r, _ in ev.reveals],
                   convictions=ev.convictions, policy=TrustPolicy(ALLOWLIST, roots | {key}, quorum))
    peer = peer_id_from_public_key(key)
    return any(f.signer == peer for f in cov.flagged)


def earned_keys(runs: Iterable[RunEvidence], *, roots: frozenset[bytes], quorum: int,
                rule: EarnRule = EarnRule()) -> dict[bytes, tuple[Pair, ...]]:
    """The keys that earn trust, each with the pairs that earned it (sorted). ``roots``: the
    listed roots (this node's key and ``trusted_peers``); earned keys never vouch for others, so
    one earned key cannot mint more."""
    judged = {ev.manifest.run_id: _RunJudgement(ev, roots, quorum) for ev in runs}
    return _earn(judged.values(), roots, rule)


class _RunJudgement:
    """One run's part of the rule: its qualifying steps per key, and (computed on demand, kept)
    whether a key is disqualified in it."""

    def __init__(self, ev: RunEvidence, roots: frozenset[bytes], quorum: int) -> None:
        self.ev, self.roots, self.quorum = ev, roots, quorum
        self.qualifying = _qualifying(ev, roots)
        self.signers = {a.signer for a, _ in ev.attestations} | {c.guilty for c in ev.convictions}
        self._disqualified: dict[bytes, bool] = {}

    def disqualifies(self, key: bytes) -> bool:
        if key not in self.signers:  # every way to be disqualified is a statement (or a trace) the key signed
            return False
        if key not in self._disqualified:
            self._disqualified[key] = _disqualified(key, self.ev, self.roots, self.quorum)
        return self._disqualified[key]


def _earn(judged: Iterable[_RunJudgement], roots: frozenset[bytes], rule: EarnRule) -> dict[bytes, tuple[Pair, ...]]:
    judged = list(judged)
    pairs: dict[bytes, set[Pair]] = defaultdict(set)
    for j in judged:
        run, publisher = j.ev.manifest.run_id, j.ev.manifest.publisher
        for key, steps in j.qualifying.items():
            pairs[key].update(Pair(run, k, publisher) for k in steps)
    earned = {}
    for key, held in pairs.items():
        if len(held) < rule.matches:
            continue
        publishers = {p.publisher for p in held}
        # 4. a root's run, whose witnesses its publisher does not leak, or P publishers
        if not publishers & roots and len(publishers) < rule.publishers:
            continue
        # disqualified in no run this node holds
        if any(j.disqualifies(key) for j in judged):
            continue
        earned[key] = tuple(sorted(held))
    return earned


class EarnedTrust:
    """:func:`earned_keys` over a store, re-reading only the runs that received statements since
    the last call (reading a run decodes, so re-verifies, every statement of it); the result is
    always the rule applied to the whole store, never an updated list."""

    def __init__(self, store: Store, roots: frozenset[bytes], quorum: int, rule: EarnRule) -> None:
        self.store, self.roots, self.quorum, self.rule = store, roots, quorum, rule
        self._judged: dict[bytes, _RunJudgement] = {}

    def __call__(self, manifests: Iterable[RunManifest], changed: Iterable[bytes]) -> dict[bytes, tuple[Pair, ...]]:
        """The earned keys, given every run ``manifests`` and the runs ``changed`` since the last call."""
        manifests = list(manifests)
        for run in set(changed):
            self._judged.pop(run, None)
        for ev in evidence_from_store(self.store, [m for m in manifests if m.run_id not in self._judged]):
            self._judged[ev.manifest.run_id] = _RunJudgement(ev, self.roots, self.quorum)
        return _earn((self._judged[m.run_id] for m in manifests), self.roots, self.rule)


def evidence_from_store(store: Store, manifests: Iterable[RunManifest]) -> list[RunEvidence]:
    return [RunEvidence(m, store.attestations_in_order(m.run_id), store.reveals_in_order(m.run_id),
                        store.replay_witnesses(m.run_id), store.fraud.convictions(m.run_id)) for m in manifests]
