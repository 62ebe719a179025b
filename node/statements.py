"""Statements: every statement that reaches this node, from gossip or sync, is validated and only
then stored; every one stored (ours included) is then told to the listeners given at wiring time.

* gossip validators (one per kind: manifest, attestation, claim, reveal, eval, spot check, fraud
  proof, fraud proof reference) answer the protocol's accept / reject / ignore
  (:mod:`open1b.protocol.validation`) and count every refusal in :attr:`Statements.validation`;
  the fraud proofs' validator, and their ingest from gossip and sync, await the referee in a
  worker thread (:attr:`Statements.referee`, :mod:`.referee_worker`);
* a fraud proof over the gossip bound arrives as a reference (gossip or sync), handed to
  :attr:`Statements.proof_refs` (the daemon's :mod:`.fraud_proof_fetch`), which judges it, fetches
  the body and stores it with :meth:`Statements.add_own` once the referee convicted;
* ``ingest_*`` store what a validator accepted, or what a sync response carried (a provably
  invalid statement from sync counts against its sender, as on gossip);
* :meth:`Statements.add_own` stores what this node signed (the outbox's first half,
  :mod:`.outbox`), :meth:`Statements.add_claim` the claims the claim agent reads from the DHT;
* listeners (the judge, the planner's view, the replay proof) are told each new statement once,
  after it is stored. They read; none of them calls back in here.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from pathlib import Path
from typing import Callable, ClassVar, Iterable, Protocol

from open1b.protocol import (
    Attestation,
    Claim,
    EvalStatement,
    Open1bError,
    Outcome,
    RunManifest,
    SpotCheck,
    public_key_from_peer_id,
    validate_attestation,
    validate_claim,
    validate_manifest,
)
from open1b.protocol.codec import decode as decode_cbor
from open1b.protocol.errors import UnjudgeableError
from open1b.protocol.validation import Verdict, validate_eval, validate_reveal, validate_spotcheck
from open1b.protocol.witness import WitnessReveal

from .clock import Clock
from .fraud_proof_refs import FraudProofRef, ProofRefs, is_large
from .fraud_proofs import Bearing, FraudRecord, ProvenFraud
from .metrics import NodeStats
from .p2p import AsyncGossipValidator, GossipHandler, GossipValidator
from .referee_worker import RefereeWorker
from .runs import why_not_auditable
from .store import Store
from .topics import (
    attestations_topic,
    claims_topic,
    evals_topic,
    fraud_proof_refs_topic,
    fraud_proofs_topic,
    reveals_topic,
    spotchecks_topic,
)

log = logging.getLogger("open1b.node.statements")

MAX_KNOWN_RUNS = 256  # manifests from the network beyond this are ignored (published ones still count)

Statement = Attestation | Claim | WitnessReveal | SpotCheck | EvalStatement | RunManifest | ProvenFraud
Listener = Callable[[Statement], None]


class Gossip(Protocol):
    """What statements need of the network (:class:`~.p2p.P2P` in a daemon, a fake in tests)."""

    def set_validator(self, topic: str, validator: GossipValidator | AsyncGossipValidator) -> None: ...

    async def subscribe(self, topic: str, handler: GossipHandler) -> None: ...

    def penalise(self, peer_id: str) -> None: ...


class Statements:
    def __init__(self, manifests: dict[bytes, RunManifest], store: Store, gossip: Gossip, *,
                 publishers: Iterable[str], trusts: Callable[[bytes], bool], clock: Clock, stats: NodeStats,
                 listeners: Iterable[Listener] = ()) -> None:
        """``manifests``: the runs this node knows, kept here (others read it); ``publishers``: the
        operator's choice of publishers (empty: any); ``trusts(key)``: whether the node's trust
        policy counts ``key`` now (the counting's, node/counting.py)."""
        self.manifests, self.store, self.gossip, self.clock, self.stats = manifests, store, gossip, clock, stats
        self.listeners = list(listeners)
        self._publishers = frozenset(public_key_from_peer_id(p) for p in publishers)
        self.runs_synced = 0  # manifests learned through the runs sync protocol
        self.validation: Counter[str] = Counter()  # "<kind>/<outcome>/<code>" of every statement refused
        self._topics: set[str] = set()
        # references to fraud proofs over the gossip bound: judged, fetched and stored by the
        # daemon's ProofFetcher (node/fraud_proof_fetch.py), which sets itself here; none, ignored
        self.proof_refs: ProofRefs | None = None
        # kind -> (the protocol's validation, how the store keeps one): the per-run statements
        self._kinds: dict[str, tuple[Callable, Callable[[object], bool]]] = {
            Attestation.KIND: (validate_attestation, store.add_attestation),
            WitnessReveal.KIND: (validate_reveal, store.add_reveal),
            SpotCheck.KIND: (validate_spotcheck, store.add_spotcheck),
            EvalStatement.KIND: (validate_eval, store.add_eval),
            Claim.KIND: (validate_claim, store.add_claim),
        }
        # fraud proofs are judged apart: the referee in a worker thread, the node's rules after it
        self.bearing = Bearing(manifests.get, store.has_attestation, trusts, store.fraud.convicts, store.fraud.holds,
                               store.fraud.fits)
        self.referee = RefereeWorker(self.bearing)

    def tell(self, statement: Statement) -> None:
        """Tell the listeners of a statement stored (here, or a stored fraud proof judged again:
        :meth:`.referee_worker.RefereeWorker.judge_stored_again`)."""
        for listener in self.listeners:
            listener(statement)

    # -- runs ------------------------------------------------------------------------------
    async def join_known_runs(self) -> None:
        for run in list(self.manifests):
            await self._join_run_topics(run)

    async def add_run(self, manifest: RunManifest, run_dir: Path | None) -> None:
        self.store.add_manifest(manifest, run_dir)
        self.manifests[manifest.run_id] = manifest
        self.tell(manifest)
        await self._join_run_topics(manifest.run_id)

    async def _join_run_topics(self, run: bytes) -> None:
        for topic, validator, handler in (
            (attestations_topic(run), self.validate_gossip_attestation, _handler(self._on_attestation)),
            (claims_topic(run), self.validator(Claim.KIND),
             _handler(functools.partial(self._ingest, Claim.KIND, source=None))),
            (reveals_topic(run), self.validator(WitnessReveal.KIND), _handler(self.ingest_reveal)),
            (evals_topic(run), self.validator(EvalStatement.KIND), _handler(self.ingest_eval)),
            (spotchecks_topic(run), self.validator(SpotCheck.KIND), _handler(self.ingest_spotcheck)),
            (fraud_proofs_topic(run), self.validator(ProvenFraud.KIND),
             lambda author, data: self.ingest_fraud_proof(data)),
            (fraud_proof_refs_topic(run), lambda author, data: self.proof_refs.gossiped(author, data)
             if self.proof_refs else Outcome.IGNORE, _nothing_to_do),
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
        if not verdict.accepted:
            self.validation[f"{kind}/{verdict.outcome.value}/{verdict.code}"] += 1
            if author is not None:
                log.info("gossip %s from %s: %s (%s)", kind, author, verdict.outcome.value, verdict.reason)
        return verdict.outcome

    def validator(self, kind: str) -> GossipValidator | AsyncGossipValidator:
        """The gossip validator of a per-run statement ``kind`` (refusals counted, not logged);
        the fraud proofs' awaits the referee's worker thread, counted against the forwarding peer."""
        if kind == ProvenFraud.KIND:
            async def judged(forwarder: str, author: str, data: bytes) -> Outcome:
                return self._judged(kind, await self.referee.judge(data, peer=forwarder))
            return judged
        validate = self._kinds[kind][0]

        def validator(author: str, data: bytes) -> Outcome:
            return self._judged(kind, validate(data, self.manifests.get, self.clock.wall()))
        return validator

    def validate_gossip_manifest(self, author: str, data: bytes) -> Outcome:
        return self._judged("manifest", self.judge_manifest(data), author)

    def validate_gossip_attestation(self, author: str, data: bytes) -> Outcome:
        return self._judged("attestation", validate_attestation(data, self.manifests.get, self.clock.wall()), author)

    def _refused_in_sync(self, verdict: Verdict, source: str | None) -> None:
        """A statement a sync response (from ``source``) carried was refused: counted, and a
        provably invalid one is held against that peer, as on gossip. (Gossip refusals are
        counted by the validators.)"""
        if source is not None:
            self.validation[f"sync/{verdict.outcome.value}/{verdict.code}"] += 1
            if verdict.outcome is Outcome.REJECT:
                self.gossip.penalise(source)

    # -- gossip handlers: what a validator accepted ------------------------------------------
    async def on_manifest(self, author: str, data: bytes) -> None:
        await self.ingest_manifest(data)

    def _on_attestation(self, data: bytes) -> None:
        if not self.ingest_attestation(data):  # the validator accepted it: a statement we hold already
            self.validation["attestation/duplicate"] += 1

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
            verdict = validate_attestation(data, self.manifests.get, self.clock.wall())
            if verdict.accepted:
                accepted.append(verdict.message)
            else:
                self._refused_in_sync(verdict, source)
        new = [att for att, added in zip(accepted, self.store.add_attestations(accepted)) if added]
        self.stats.attestations_received += len(new)
        for att in new:
            self.tell(att)
        return len(new)

    def _ingest(self, kind: str, data: bytes, source: str | None) -> bool:
        validate, add = self._kinds[kind]
        verdict = validate(data, self.manifests.get, self.clock.wall())
        if not verdict.accepted:
            self._refused_in_sync(verdict, source)
            return False
        added = add(verdict.message)
        if added:
            self.tell(verdict.message)
        return added

    def ingest_reveal(self, data: bytes, source: str | None = None) -> bool:
        """Validate and store one witness reveal; True if it was new (as :meth:`ingest_attestation`)."""
        return self._ingest(WitnessReveal.KIND, data, source)

    def ingest_eval(self, data: bytes, source: str | None = None) -> bool:
        """Validate and store one ``eval`` statement; True if it was new (node/evaluator.py acts on it)."""
        return self._ingest(EvalStatement.KIND, data, source)

    def ingest_spotcheck(self, data: bytes, source: str | None = None) -> bool:
        """Validate and store one ``spotcheck``; True if it was new. Counted by the judge's spot
        coverage, never as a replay."""
        return self._ingest(SpotCheck.KIND, data, source)

    async def ingest_fraud_proof(self, data: bytes, source: str | None = None) -> bool:
        """Validate (the referee, then node/fraud_proofs.py's rules) and store one fraud proof;
        True if it holds a conviction not stored yet."""
        verdict = await self.referee.judge(data)
        if not verdict.accepted:
            self._refused_in_sync(verdict, source)
            return False
        return self.add_own(verdict.message)

    async def ingest_synced(self, frames: list[bytes], source: str) -> int:
        """A sync response: attestations, witness reveals, spot checks and fraud proofs, told apart by their kind; the
        attestations are stored in one transaction (the order does not matter: what is judged
        is a function of the set). How many were new."""
        attestations, new = [], 0
        for data in frames:
            try:
                value = decode_cbor(data, max_size=len(data))
                kind = value.get("kind") if type(value) is dict else None
            except Open1bError:
                kind = None
            if kind in (WitnessReveal.KIND, SpotCheck.KIND):
                new += self._ingest(kind, data, source)
            elif kind == ProvenFraud.KIND:
                new += await self.ingest_fraud_proof(data, source)
            elif kind == FraudProofRef.KIND and self.proof_refs:  # counted new once its body is stored
                self.proof_refs.synced(data, source)
            else:
                attestations.append(data)
        return new + self.ingest_attestations(attestations, source=source)

    def add_claim(self, claim: Claim) -> None:
        """A claim read from the DHT or gossip (validated by the caller): stored while its run is known."""
        if claim.run in self.manifests and self.store.add_claim(claim):
            self.tell(claim)

    def add_own(self, statement: Attestation | WitnessReveal | SpotCheck | EvalStatement | ProvenFraud) -> bool:
        """Store a statement this node signed or checked already (:mod:`.outbox`); True if new."""
        add = self.store.fraud.add if isinstance(statement, ProvenFraud) else self._kinds[statement.KIND][1]
        added = add(statement)
        if added:
            self.tell(statement)
        return added

    def statements_for_sync(self, run: bytes, *, refs: bool = True) -> list[
            Attestation | WitnessReveal | SpotCheck | StoredProof | FraudProofRef] | None:
        """What a sync response carries: a proof within the gossip bound read from the store as it
        is sent, a larger one as its reference — or, with ``refs`` False (a puller of r22 and
        earlier, node/sync.py), not at all."""
        if run not in self.manifests:
            return None
        proofs = self.store.fraud.of_run(run)
        return [*self.store.attestations(run), *self.store.reveals(run), *self.store.spotchecks(run),
                *(StoredProof(self.store, f) for f in proofs if not is_large(f)),
                *(FraudProofRef.of(f) for f in proofs if refs and is_large(f))]


class StoredProof:
    """A stored proof whose bytes are read when sent (a sync response holds up to 64 of 1 MiB)."""

    KIND: ClassVar[str] = ProvenFraud.KIND

    def __init__(self, store: Store, fraud: FraudRecord) -> None:
        self.store, self.fraud = store, fraud

    @property
    def encoded(self) -> bytes:
        return self.store.fraud.body(self.fraud.run, self.fraud.digest) or b""


async def _nothing_to_do(author: str, data: bytes) -> None:
    """The references' topic delivers only this node's own (its validator accepts no other)."""


def _handler(ingest: Callable[[bytes], object]) -> GossipHandler:
    """A gossip handler that hands what a validator accepted to ``ingest``."""
    async def handler(author: str, data: bytes) -> None:
        ingest(data)
    return handler
