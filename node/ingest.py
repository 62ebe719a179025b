"""Ingest: every statement that reaches this node, from gossip or sync, is validated and only
then stored — and what is stored is judged (coverage, flags, the planner's indexes).

* gossip validators (one per kind: manifest, attestation, claim, reveal) answer the protocol's
  accept / reject / ignore (:mod:`open1b.protocol.validation`) and count every refusal;
* ``ingest_*`` store what a validator accepted, or what a sync response carried (a provably
  invalid statement from sync counts against its sender, as on gossip);
* the trust policy is the operator's list plus the keys that earned trust
  (:mod:`.earned_trust`), recomputed from the store as statements arrive;
* the planner's view (:class:`~.deficits.RunIndexes`) counts an attestation only when the trust
  policy counts its key, coverage has not flagged the key and no held reveal disproves it;
* :meth:`Ingest.serve_judgements` re-judges flags and publishes the witness reveals our own
  replays call for (docs/run-format.md §5).
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from pathlib import Path
from typing import Protocol

import trio

from open1b.protocol import (
    Attestation,
    Claim,
    Coverage,
    Identity,
    Open1bError,
    Outcome,
    RunManifest,
    SpotCheck,
    SpotCoverage,
    TrustPolicy,
    coverage,
    peer_id_from_public_key,
    public_key_from_peer_id,
    spot_coverage,
    validate_attestation,
    validate_claim,
    validate_manifest,
)
from open1b.protocol.codec import decode as decode_cbor
from open1b.protocol.coverage import ALLOWLIST
from open1b.protocol.errors import UnjudgeableError
from open1b.protocol.spotcheck import FAIL
from open1b.protocol.validation import Verdict, validate_eval, validate_reveal, validate_spotcheck
from open1b.protocol.witness import WitnessReveal

from .clock import Clock
from .config import NodeConfig
from .deficits import RunIndexes
from .earned_trust import EarnedTrust, EarnRule, Pair
from .metrics import NodeStats
from .p2p import GossipHandler, GossipValidator
from .replay_proof import ReplayProof
from .runs import why_not_auditable
from .store import Store
from .topics import attestations_topic, claims_topic, evals_topic, reveals_topic, spotchecks_topic

log = logging.getLogger("open1b.node.ingest")

MAX_KNOWN_RUNS = 256  # manifests from the network beyond this are ignored (published ones still count)
JUDGE_EVERY_S = 1.0


class Gossip(Protocol):
    """What ingest needs of the network (:class:`~.p2p.P2P` in a daemon, a fake in tests)."""

    def set_validator(self, topic: str, validator: GossipValidator) -> None: ...

    async def subscribe(self, topic: str, handler: GossipHandler) -> None: ...

    async def publish(self, topic: str, data: bytes) -> None: ...

    def penalise(self, peer_id: str) -> None: ...


class Ingest:
    def __init__(self, identity: Identity, config: NodeConfig, store: Store, gossip: Gossip, *,
                 clock: Clock, stats: NodeStats) -> None:
        self.identity, self.config, self.store, self.gossip = identity, config, store, gossip
        self.clock, self.stats = clock, stats
        self.manifests: dict[bytes, RunManifest] = {m.run_id: m for m in store.manifests()}
        self.runs_synced = 0  # manifests learned through the runs sync protocol
        # Identity derives its public key from the seed on every read: once here, not per statement.
        self.public_key = identity.public_key
        self.listed = config.trust(self.public_key)  # own key and trusted_peers: never lost
        # Keys that earned trust (docs/protocol.md §8.1.1), with the (run, step) pairs that earned
        # them: recomputed from the store whenever statements arrive (refresh_flags), never kept.
        self.earned: dict[bytes, tuple[Pair, ...]] = {}
        self._earn = EarnedTrust(store, self.listed.roots, self.listed.quorum,
                                 EarnRule(config.earn_trust_matches, config.earn_trust_publishers))
        self._policy = self.listed
        self._publishers = frozenset(public_key_from_peer_id(p) for p in config.publishers)
        # Per run, the keys coverage flags (docs/protocol.md §8.1): the planner stops counting
        # their attestations too, so the steps they alone covered are replayed again.
        self.flagged: dict[bytes, frozenset[bytes]] = {}
        self._stale: set[bytes] = set()  # runs with statements not yet judged for flags
        self.validation: Counter[str] = Counter()  # "<kind>/<outcome>/<code>" of every statement refused
        self.proof = ReplayProof(identity, store, self.counts)  # our replays' witnesses, and the reveals they call for
        self.deficits = self._indexes()
        self._topics: set[str] = set()
        self._spotchecks: dict[bytes, list[SpotCheck]] = {}  # per run, as stored (see _run_spotchecks)
        self._spot_coverage: dict[bytes, tuple[tuple, SpotCoverage]] = {}  # per run: (inputs, result)

    @property
    def trust(self) -> TrustPolicy:
        """The policy coverage and the planner apply now: the listed roots and the earned keys."""
        return self._policy

    def _earning(self) -> bool:
        return self.config.earn_trust and self.listed.name == ALLOWLIST

    def _indexes(self) -> RunIndexes:
        return RunIndexes(self.public_key, self.config.redundancy, self._load_run, self.clock.wall)

    def _load_run(self, run: bytes) -> tuple[int, list[Attestation], list[Claim]]:
        attestations = [a for a in self.store.attestations(run) if self.plans_with(a)]
        return self.manifests[run].steps, attestations, self.store.claims(run, live_at=self.clock.wall())

    def manifest(self, run: bytes) -> RunManifest | None:
        return self.manifests.get(run)

    # -- runs ------------------------------------------------------------------------------
    async def join_known_runs(self) -> None:
        for run in list(self.manifests):
            await self._join_run_topics(run)
            self._stale.add(run)  # judged once at start: flags and the per-run metrics

    async def add_run(self, manifest: RunManifest, run_dir: Path | None) -> None:
        self.store.add_manifest(manifest, run_dir)
        self.manifests[manifest.run_id] = manifest
        await self._join_run_topics(manifest.run_id)

    async def _join_run_topics(self, run: bytes) -> None:
        for topic, validator, handler in (
            (attestations_topic(run), self.validate_gossip_attestation, self._on_attestation),
            (claims_topic(run), self.validate_gossip_claim, self._on_claim),
            (reveals_topic(run), self.validate_gossip_reveal, self._on_reveal),
            (evals_topic(run), self.validate_gossip_eval, self._on_eval),
            (spotchecks_topic(run), self.validate_gossip_spotcheck, self._on_spotcheck),
        ):
            if topic in self._topics:
                continue
            self._topics.add(topic)
            self.gossip.set_validator(topic, validator)
            await self.gossip.subscribe(topic, handler)

    def judge_manifest(self, data: bytes) -> Verdict:
        verdict = validate_manifest(data, self.clock.wall())
        if not verdict.accepted:
            return verdict
        try:
            # [IGNORE] a manifest of this node's kind (external trajectories are not gossiped here)
            if not isinstance(verdict.message, RunManifest):
                raise UnjudgeableError("not a run manifest", code="manifest_kind")
            # A known run is always accepted below: it may be our own, or one the operator named.
            if verdict.message.run_id not in self.manifests:
                # [IGNORE] a publisher the operator did not choose (config: publishers)
                if self._publishers and verdict.message.publisher not in self._publishers:
                    raise UnjudgeableError("not a publisher this node audits", code="publisher")
                # [IGNORE] room for one more run
                if len(self.manifests) >= MAX_KNOWN_RUNS:
                    raise UnjudgeableError("too many runs known", code="runs_full")
        except UnjudgeableError as exc:
            return Verdict(exc.outcome, f"{type(exc).__name__}: {exc}", code=exc.code)
        return verdict

    async def ingest_manifest(self, data: bytes, source: str | None = None) -> bool:
        """Validate and store a manifest from gossip or sync; True if the run is new here."""
        verdict = self.judge_manifest(data)
        if not verdict.accepted:
            self._refused_in_sync(verdict, source)
            return False
        manifest = verdict.message
        if manifest.run_id in self.manifests:
            return False
        # Counted first: add_run shows the run before it awaits the topic joins, and a reader of
        # the status must never see a synced run that the counter has not counted yet.
        self.runs_synced += source is not None
        await self.add_run(manifest, None)
        why = why_not_auditable(manifest)
        log.info("learned run %s (%d steps, publisher %s)%s", manifest.run_id.hex()[:16], manifest.steps,
                 manifest.signer_peer_id, f"; not auditing it: {why}" if why else "")
        return True

    # -- gossip validators: the protocol's verdicts, counted -------------------------------
    def _judged(self, kind: str, verdict: Verdict, author: str | None = None) -> Outcome:
        self.stats.record_gossip(kind, verdict.outcome.value)
        self._count_refusal(kind, verdict)
        if author is not None and verdict.outcome is not Outcome.ACCEPT:
            log.info("gossip %s from %s: %s (%s)", kind, author, verdict.outcome.value, verdict.reason)
        return verdict.outcome

    def validate_gossip_manifest(self, author: str, data: bytes) -> Outcome:
        return self._judged("manifest", self.judge_manifest(data), author)

    def validate_gossip_attestation(self, author: str, data: bytes) -> Outcome:
        return self._judged("attestation", validate_attestation(data, self.manifest, self.clock.wall()), author)

    def validate_gossip_claim(self, author: str, data: bytes) -> Outcome:
        return self._judged("claim", validate_claim(data, self.manifest, self.clock.wall()))

    def validate_gossip_reveal(self, author: str, data: bytes) -> Outcome:
        return self._judged("reveal", validate_reveal(data, self.manifest, self.clock.wall()))

    def validate_gossip_eval(self, author: str, data: bytes) -> Outcome:
        return self._judged("eval", validate_eval(data, self.manifest, self.clock.wall()))

    def validate_gossip_spotcheck(self, author: str, data: bytes) -> Outcome:
        return self._judged("spotcheck", validate_spotcheck(data, self.manifest, self.clock.wall()))

    def _count_refusal(self, kind: str, verdict: Verdict) -> None:
        if not verdict.accepted:
            self.validation[f"{kind}/{verdict.outcome.value}/{verdict.code}"] += 1

    def _refused_in_sync(self, verdict: Verdict, source: str | None) -> None:
        """A statement a sync response (from ``source``) carried was refused: counted, and a
        provably invalid one is held against that peer, as on gossip. (Gossip refusals are
        counted by the validators.)"""
        if source is not None:
            self._count_refusal("sync", verdict)
            if verdict.outcome is Outcome.REJECT:
                self.gossip.penalise(source)

    # -- gossip handlers: what a validator accepted ------------------------------------------
    async def on_manifest(self, author: str, data: bytes) -> None:
        await self.ingest_manifest(data)

    async def _on_attestation(self, author: str, data: bytes) -> None:
        if not self.ingest_attestation(data):  # the validator accepted it: a statement we hold already
            self.validation["attestation/duplicate"] += 1

    async def _on_claim(self, author: str, data: bytes) -> None:
        verdict = validate_claim(data, self.manifest, self.clock.wall())
        if verdict.accepted:
            self.seen_claim(verdict.message)

    async def _on_reveal(self, author: str, data: bytes) -> None:
        self.ingest_reveal(data)

    async def _on_eval(self, author: str, data: bytes) -> None:
        self.ingest_eval(data)

    async def _on_spotcheck(self, author: str, data: bytes) -> None:
        self.ingest_spotcheck(data)

    # -- statements ----------------------------------------------------------------------------
    def ingest_attestation(self, data: bytes, source: str | None = None) -> bool:
        """Validate and store one attestation from anywhere; True if it was new. ``source``: the
        peer a sync response came from — a provably invalid statement counts against it, as on gossip."""
        return self.ingest_attestations([data], source) == 1

    def ingest_attestations(self, frames: list[bytes], source: str | None = None) -> int:
        """Validate each of ``frames`` (the full strict decode and signature check, one by one),
        then store the accepted ones in one transaction; how many were new."""
        accepted = []
        for data in frames:
            verdict = validate_attestation(data, self.manifest, self.clock.wall())
            if verdict.accepted:
                accepted.append(verdict.message)
            else:
                self._refused_in_sync(verdict, source)
        new = [att for att, added in zip(accepted, self.store.add_attestations(accepted)) if added]
        self.stats.attestations_received += len(new)
        for att in new:
            self._stored(att)
        return len(new)

    def add_own_attestation(self, att: Attestation) -> bool:
        """Store a statement this node signed (validated by construction); True if new."""
        added = self.store.add_attestation(att)
        if added:
            self._stored(att)
        return added

    async def publish_own_attestation(self, att: Attestation) -> None:
        """Store a statement this node signed and gossip it."""
        self.add_own_attestation(att)
        await self.gossip.publish(attestations_topic(att.run), att.encoded)

    def _stored(self, att: Attestation) -> None:
        self.proof.check(att)
        self._stale.add(att.run)
        if self.plans_with(att):
            self.deficits.add_attestation(att)

    def plans_with(self, att: Attestation) -> bool:
        """Whether the planner counts ``att``: our own always (we never attest a step twice);
        others' when coverage has not flagged the key, no held witness reveal disproves it, and
        the trust policy counts the key — or, with ``plan_with_untrusted`` (off by default), it is a
        key the policy does not count: a step complete but for trust is not replayed again (it
        would be, by every node, forever); coverage still does not count it (docs/reliability.md)."""
        if att.signer == self.public_key:
            return True
        if att.signer in self.flagged.get(att.run, ()) or self.proof.disproves(att):
            return False
        return self.trust.trusts(att.signer) or self.config.plan_with_untrusted

    def counts(self, run: bytes, key: bytes) -> bool:
        return self.trust.trusts(key) and key not in self.flagged.get(run, ())

    def ingest_reveal(self, data: bytes, source: str | None = None) -> bool:
        """Validate and store one witness reveal; True if it was new (as :meth:`ingest_attestation`)."""
        verdict = validate_reveal(data, self.manifest, self.clock.wall())
        if not verdict.accepted:
            self._refused_in_sync(verdict, source)
            return False
        added = self.store.add_reveal(verdict.message)
        if added:
            self.revealed(verdict.message)
        return added

    def ingest_eval(self, data: bytes, source: str | None = None) -> bool:
        """Validate and store one ``eval`` statement; True if it was new (node/evaluator.py acts on it)."""
        verdict = validate_eval(data, self.manifest, self.clock.wall())
        if not verdict.accepted:
            self._refused_in_sync(verdict, source)
            return False
        return self.store.add_eval(verdict.message)

    def ingest_spotcheck(self, data: bytes, source: str | None = None) -> bool:
        """Validate and store one ``spotcheck``; True if it was new. Counted by :meth:`spot_coverage`,
        never as a replay."""
        verdict = validate_spotcheck(data, self.manifest, self.clock.wall())
        if not verdict.accepted:
            self._refused_in_sync(verdict, source)
            return False
        return self._stored_spotcheck(verdict.message)

    def add_own_spotcheck(self, sc: SpotCheck) -> bool:
        """Store a spot check this node signed (validated by construction); True if new."""
        return self._stored_spotcheck(sc)

    def _stored_spotcheck(self, sc: SpotCheck) -> bool:
        new = self.store.add_spotcheck(sc)
        if new and sc.run in self._spotchecks:
            self._spotchecks[sc.run].append(sc)
        return new

    def _run_spotchecks(self, run: bytes) -> list[SpotCheck]:
        """The run's stored spot checks, read from the store once and then kept up to date: the
        spot checker's lanes and the replay planner ask on every pass, and reading and decoding
        them all each time (0.26 s for 679 of them) starved a daemon's event loop."""
        if run not in self._spotchecks:
            self._spotchecks[run] = list(self.store.spotchecks(run))
        return self._spotchecks[run]

    def spot_failed(self, run: bytes) -> list[int]:
        """Steps a counted spot check failed (the replay planner takes them first). Stored spot checks
        passed §7's rules on the way in, so only the trust policy is applied here."""
        return sorted({s.step for s in self._run_spotchecks(run) if s.verdict == FAIL and self.trust.trusts(s.signer)})

    def spot_coverage(self, run: bytes, replay: Coverage) -> SpotCoverage:
        """Spot-check status and escape probabilities (docs/protocol.md §8.7); the steps ``replay``
        decided (verified or refuted) count as caught. Computed again only when the run's spot
        checks, its decided steps or the trust policy changed (each pass re-checks every
        statement's challenge signatures: 0.23 s for 679)."""
        decided = frozenset(replay.replayed_steps)
        statements = self._run_spotchecks(run)
        key = (len(statements), decided, self.trust)
        cached = self._spot_coverage.get(run)
        if cached is None or cached[0] != key:
            cached = key, spot_coverage(self.manifests[run], statements, policy=self.trust, replayed=decided)
            self._spot_coverage[run] = cached
        return cached[1]

    def revealed(self, reveal: WitnessReveal) -> None:
        """A new reveal: coverage may flag a copier now, and the planner stops counting the matches
        it disproves (so the steps they alone covered are replayed again)."""
        self.proof.stored_reveal(reveal)
        self._stale.add(reveal.run)
        self.deficits = self._indexes()

    def ingest_synced(self, frames: list[bytes], source: str) -> int:
        """A sync response: attestations, witness reveals and spot checks, told apart by their kind; the
        attestations are stored in one transaction (the order does not matter: what is judged
        is a function of the set). How many were new."""
        attestations, new = [], 0
        for data in frames:
            try:
                value = decode_cbor(data, max_size=len(data))
                kind = value.get("kind") if type(value) is dict else None
            except Open1bError:
                kind = None
            if kind == WitnessReveal.KIND:
                new += self.ingest_reveal(data, source=source)
            elif kind == SpotCheck.KIND:
                new += self.ingest_spotcheck(data, source=source)
            else:
                attestations.append(data)
        return new + self.ingest_attestations(attestations, source=source)

    def seen_claim(self, claim: Claim) -> None:
        if claim.run in self.manifests:
            self.store.add_claim(claim)
            self.deficits.add_claim(claim)

    def statements_for_sync(self, run: bytes) -> list[Attestation | WitnessReveal | SpotCheck] | None:
        if run not in self.manifests:
            return None
        return [*self.store.attestations(run), *self.store.reveals(run), *self.store.spotchecks(run)]

    # -- judgements ----------------------------------------------------------------------------
    def coverage(self, run: bytes, redundancy: int | None = None) -> Coverage:
        now = self.clock.wall()
        return coverage(
            self.manifests[run], self.store.attestations(run), self.store.claims(run, live_at=now),
            reveals=self.store.reveals(run),
            now=now, redundancy=redundancy or self.config.redundancy, policy=self.trust,
        )

    def refresh_earned(self) -> bool:
        """Recompute the earned keys from the store; True if the set changed (then every run is
        judged again under the new policy)."""
        if not self._earning():
            return False
        earned = self._earn(self.manifests.values(), self._stale)
        changed = earned.keys() != self.earned.keys()
        if changed:
            log.info("earned trust: %s", sorted(peer_id_from_public_key(k) for k in earned) or "none")
            self._stale.update(self.manifests)
        self.earned = earned
        self._policy = dataclasses.replace(self.listed, roots=self.listed.roots | earned.keys())
        return changed

    def refresh_flags(self) -> bool:
        """Re-judge earned trust and flags when runs have new statements; when the policy or a
        run's flagged keys change, the planner's indexes are rebuilt without (or again with) their
        attestations. True if any changed."""
        changed = bool(self._stale) and self.refresh_earned()
        for run in list(self._stale):
            self._stale.discard(run)
            cov = self.coverage(run)
            self.stats.run_steps[run.hex()] = dict(Counter(s.status for s in cov.steps))
            flagged = frozenset(public_key_from_peer_id(f.signer) for f in cov.flagged)
            if flagged != self.flagged.get(run, frozenset()):
                log.warning("run %s: flagged keys now %s", run.hex()[:12],
                            sorted(peer_id_from_public_key(k) for k in flagged) or "none")
                self.flagged[run] = flagged
                changed = True
        if changed:
            self.deficits = self._indexes()
        return changed

    async def publish_due_reveals(self) -> None:
        for reveal in self.proof.due(self.clock.wall()):
            self.revealed(reveal)
            await self.gossip.publish(reveals_topic(reveal.run), reveal.encoded)

    async def serve_judgements(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Every second: publish the reveals our replays call for, and re-judge flags."""
        task_status.started()
        while True:
            await self.clock.sleep(JUDGE_EVERY_S)
            await self.publish_due_reveals()
            self.refresh_flags()
