"""Earned trust (docs/protocol.md §8.1): which keys a node adds to its policy's ``roots`` because
they have proven, on steps its own roots also replayed, that they replay.

Coverage stays a pure function of statements and policy; this module only chooses the policy's
roots, from what the node's store holds and in what order it arrived. The order is the point: a
match that binds a step's witness W_k and reached this node before any reveal of W_k was signed by
someone who knew W_k without being told by a reveal — it replayed the step, or the run's publisher
told it, hence the publisher condition. Nothing here is kept between calls: the daemon recomputes
it from the store whenever statements arrive (node/ingest.py), so earning, and losing it on a
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
    W_k from this node's own replays (checked against the manifest's C_k, never gossiped)."""

    manifest: RunManifest
    attestations: Sequence[tuple[Attestation, int]]
    reveals: Sequence[tuple[WitnessReveal, int]] = ()
    own_witnesses: Mapping[int, bytes] = field(default_factory=dict)


@dataclass(frozen=True, order=True)
class Pair:
    """One (run, step) on which a key's proven match agreed with a root's; ``publisher`` is the run's."""

    run: bytes
    step: int
    publisher: bytes


def _qualifying(ev: RunEvidence, roots: frozenset[bytes]) -> dict[bytes, set[int]]:
    """Per non-root key, the steps of this run that satisfy conditions (a) and (b) of §8.1."""
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
        # (a) stored before the first reveal of the step: a later match may be a copy of it
        if att.step in first_reveal and seq > first_reveal[att.step]:
            continue
        # (b) a root proved the same step with the same post_state
        if att.post_state in rooted.get(att.step, ()):
            out[att.signer].add(att.step)
    return out


def _disqualified(key: bytes, ev: RunEvidence, roots: frozenset[bytes], quorum: int) -> bool:
    """``key`` is flagged in this run were it counted (§8.3 with ``key`` among the roots), or it
    reported a post_state for a step that a root reported otherwise (one of them signed a false
    result, and the node believes its roots), or it signed a match binding another witness than
    the W_k this node computed itself (a copy, whether or not anyone revealed W_k)."""
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
                   policy=TrustPolicy(ALLOWLIST, roots | {key}, quorum))
    peer = peer_id_from_public_key(key)
    return any(f.signer == peer for f in cov.flagged)


def earned_keys(runs: Iterable[RunEvidence], *, roots: frozenset[bytes], quorum: int,
                rule: EarnRule = EarnRule()) -> dict[bytes, tuple[Pair, ...]]:
    """The keys that earn trust, each with the pairs that earned it (sorted). ``roots``: the
    listed roots (this node's key and ``trusted_peers``); earned keys never vouch for others, so
    one earned key cannot mint more."""
    runs = list(runs)
    pairs: dict[bytes, set[Pair]] = defaultdict(set)
    for ev in runs:
        for key, steps in _qualifying(ev, roots).items():
            pairs[key].update(Pair(ev.manifest.run_id, k, ev.manifest.publisher) for k in steps)
    earned = {}
    for key, held in pairs.items():
        if len(held) < rule.matches:
            continue
        publishers = {p.publisher for p in held}
        # (c) a root's run, whose witnesses its publisher does not leak, or P publishers
        if not publishers & roots and len(publishers) < rule.publishers:
            continue
        # (d) flagged in no run this node holds
        if any(_disqualified(key, ev, roots, quorum) for ev in runs):
            continue
        earned[key] = tuple(sorted(held))
    return earned


def evidence_from_store(store: Store, manifests: Iterable[RunManifest]) -> list[RunEvidence]:
    return [RunEvidence(m, store.attestations_in_order(m.run_id), store.reveals_in_order(m.run_id),
                        store.replay_witnesses(m.run_id)) for m in manifests]
