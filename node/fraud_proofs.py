"""Fraud proofs as statements of a run (docs/protocol.md §9, §18): what a node gossips, stores and
serves once the referee (:func:`open1b.protocol.dispute.verify_fraud_proof`) convicted someone.

:func:`judge_fraud_proof` is the gossip rule over the referee's verdict, in order:

- ``[REJECT]`` larger than :data:`MAX_GOSSIP_FRAUD_PROOF` (a gossip message, less the pubsub
  envelope) — ``oversize``, before a byte is decoded; a larger proof travels as a reference and
  its body is fetched by digest (node/fraud_proof_refs.py, node/fraud_proof_fetch.py), then judged
  here with the referee's own bound, ``MAX_FRAUD_PROOF_SIZE``;
- the referee's rules (§18.4): its ``[REJECT]`` and ``[IGNORE]`` codes as they are;
- ``[IGNORE]`` a run this node does not know — ``unknown_run``;
- ``[REJECT]`` a step outside the run, or traces that do not start from the run's published h_k
  — ``pre_state``: the proof is about some computation, not this run's step;
- ``[IGNORE]`` no guilty key is the run's publisher or a key with a stored attestation of that
  step — ``not_attested``;
- ``[IGNORE]`` none of those keys is the publisher or counts (r25): the node's trust policy
  counts it (listed or earned; flagged or not, since a conviction flags the key it convicts), or
  the node keeps a conviction of it in the run already (the other party's proof of the same
  conviction, or one at an earlier step, must still replace it, or nodes would cite different
  proofs) — ``not_counted``.
  Keys are free: anyone can attest a step with fresh keys, then convict them with made-up
  disputes between themselves; a proof that convicts no counted key changes no status and no
  vote this node counts. Ignored, not rejected: the key may count at the node that relayed it;
- ``[IGNORE]`` the node keeps this proof, or for each guilty key one that makes it add nothing
  (:meth:`~.fraud_proof_store.FraudProofs.holds`: the same conviction by a lower digest, or an
  earlier step) — ``held``: the store would not keep it, so it is not relayed either (r29; before,
  every copy gossiped under another author crossed the mesh again);
- ``[IGNORE]`` the run's bound would not keep it (:mod:`.fraud_proof_store`) — ``run_full``.

Every ACCEPT is a proof the store would keep: what the router forwards follows the store's
decision.

It comes in two halves: :func:`referee_fraud_proof`, the bound and the referee (the costly part,
~15 ms at 1 MiB and seconds at 128 MiB, a function of the bytes alone), which a node runs in a
worker thread (node/referee_worker.py), and :func:`relevant_fraud`, the node's rules after it,
over what a :class:`Bearing` reads of the node.

A proof is judged once, when it arrives (the node's own, when its bisection builds it:
:func:`proven_by` reads that verdict's proof without a second referee run): the store keeps the
verdict (a :class:`FraudRecord`) with the bytes, by digest (node/fraud_proof_store.py), and
reading it back runs no referee.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, ClassVar, Protocol

from open1b.protocol import Conviction, Outcome, RunManifest
from open1b.protocol.dispute import FraudProof, FraudVerdict, verify_fraud_proof
from open1b.protocol.hashing import blake2b256
from open1b.protocol.identity import peer_id_from_public_key
from open1b.protocol.validation import Verdict

MAX_GOSSIP_FRAUD_PROOF = (1 << 20) - 4096
"""Bytes of a gossiped fraud proof: p2p.py's MAX_PUBSUB_MESSAGE less the pubsub envelope
(docs/protocol.md §9; spelled out so that the store, which the CLI opens, loads no libp2p)."""

REFEREE = "r20"
"""The spec revision of the referee's rules (§18.4) this node runs: the last that changed a
verdict (r20, the update's outputs). The store keeps it with each verdict; a proof judged under
another is not read out until the daemon judged it again, in the background after the store
opened (node/fraud_proof_store.py): bump it when the referee changes."""


@dataclass(frozen=True)
class FraudRecord:
    """What the referee found in a fraud proof about a known run's step, without its bytes: what
    the store reads back, coverage counts and sync announces. ``guilty`` signed an op output that
    does not follow from inputs it signed as well. ``digest``, B2 of the proof's ``size`` bytes,
    is how coverage and the API cite it."""

    run: bytes
    step: int
    op: str
    position: int
    guilty: tuple[bytes, ...]
    pre_state: bytes
    post_states: tuple[bytes, ...]  # each guilty key's trace's post_state, in the order of ``guilty``
    digest: bytes
    size: int

    def convictions(self) -> list[Conviction]:
        """What coverage reads of it (docs/protocol.md §8.3): one conviction per guilty key."""
        return [Conviction(self.run, self.step, k, self.pre_state, post, self.digest)
                for k, post in zip(self.guilty, self.post_states)]

    def to_json(self) -> dict:
        return {"digest": self.digest.hex(), "run": self.run.hex(), "step": self.step, "op": self.op,
                "position": self.position, "guilty": [peer_id_from_public_key(k) for k in self.guilty],
                "bytes": self.size}


@dataclass(frozen=True)
class ProvenFraud(FraudRecord):
    """A fraud proof the referee accepted, with its bytes (``encoded``): what is gossiped, fetched
    and stored."""

    KIND: ClassVar[str] = "fraud_proof"

    encoded: bytes = field(kw_only=True, repr=False)

    @property
    def record(self) -> FraudRecord:
        return FraudRecord(self.run, self.step, self.op, self.position, self.guilty, self.pre_state,
                           self.post_states, self.digest, self.size)


def proven_by(data: bytes, verdict: FraudVerdict) -> ProvenFraud:
    """The proof ``data`` as the referee's accepting ``verdict`` on it reads it: decoded again and
    hashed, the referee not run again. For a verdict already at hand: the node's own proof, which
    its bisection judged when it built it (node/disputes.py, node/referee_worker.py)."""
    traces = FraudProof.decode(data).traces  # the referee checked both agree on run, step and pre_state
    post = {t.tracer: t.post_state for t in traces}
    # hashed here, off the event loop where a node runs this: ~0.5 s at 128 MiB
    return ProvenFraud(verdict.run, verdict.step, verdict.op, verdict.position, verdict.guilty,
                       traces[0].pre_state, tuple(post[k] for k in verdict.guilty), blake2b256(data), len(data),
                       encoded=data)


def _verdict(outcome: Outcome, code: str, reason: str) -> Verdict:
    return Verdict(outcome, reason, code=code)


def referee_fraud_proof(data: bytes, *, max_size: int = MAX_GOSSIP_FRAUD_PROOF) -> Verdict[ProvenFraud]:
    """The first half of :func:`judge_fraud_proof`: the size bound, then the referee, and the
    proof's digest. A function of ``data`` alone (no store, no manifests), so that a node runs it
    in a worker thread (node/referee_worker.py): up to seconds at ``MAX_FRAUD_PROOF_SIZE``."""
    if len(data) > max_size:
        return _verdict(Outcome.REJECT, "oversize", f"{len(data)} bytes, more than {max_size}")
    verdict = verify_fraud_proof(data)
    if not verdict.accepted:
        return _verdict(verdict.outcome, verdict.code, verdict.reason)
    return Verdict(Outcome.ACCEPT, "the referee convicts", message=proven_by(data, verdict))


class Ranked(Protocol):
    """What the run's bound ranks a proof by (node/fraud_proof_store.py): a proof's record, or a
    reference to one before its body is fetched."""

    run: bytes
    step: int
    digest: bytes
    size: int
    guilty: tuple[bytes, ...]


@dataclass(frozen=True)
class Bearing:
    """What :func:`relevant_fraud` reads of the node: its runs; whether a key has a stored
    attestation of a step (``attested(run, step, key)``); whether its trust policy counts a key
    now (``trusts(key)``, node/counting.py); whether it keeps a proof convicting a key
    (``convicts(run, key)``), whether it keeps what makes a proof add nothing
    (``holds(run, step, guilty, digest)``) and whether the run's bound keeps a proof so ranked
    (``fits(ranked)``), all node/fraud_proof_store.py."""

    manifest_of: Callable[[bytes], RunManifest | None]
    attested: Callable[[bytes, int, bytes], bool]
    trusts: Callable[[bytes], bool]
    convicts: Callable[[bytes, bytes], bool]
    holds: Callable[[bytes, int, tuple[bytes, ...], bytes], bool]
    fits: Callable[[Ranked], bool]

    def bears(self, run: bytes, step: int, guilty: tuple[bytes, ...], publisher: bytes) -> str | None:
        """Why a conviction of ``guilty`` does not bear on this node's coverage (a code), or None."""
        if publisher in guilty:
            return None
        attested = [k for k in guilty if self.attested(run, step, k)]
        if not attested:
            return "not_attested"
        counted = any(self.trusts(k) or self.convicts(run, k) for k in attested)
        return None if counted else "not_counted"


_WHY = {"not_attested": "no guilty key published the run or attested the step",
        "not_counted": "no guilty key that attested the step counts here",
        "held": "this node keeps that proof or a lower digest of each conviction",
        "run_full": "the run keeps as many proofs as its bound allows, all ranked before this one"}


def relevant_fraud(fraud: ProvenFraud, bearing: Bearing) -> Verdict[ProvenFraud]:
    """The second half of :func:`judge_fraud_proof`: the node's rules on a proof the referee
    accepted (cheap; they read the node's runs and store)."""
    manifest = bearing.manifest_of(fraud.run)
    if manifest is None:
        return _verdict(Outcome.IGNORE, "unknown_run", "a run this node does not know")
    if fraud.step >= manifest.steps or fraud.pre_state != manifest.state_hashes[fraud.step]:
        return _verdict(Outcome.REJECT, "pre_state", "the traces do not start from the run's published state")
    why = bearing.bears(fraud.run, fraud.step, fraud.guilty, manifest.publisher)
    if why is None and bearing.holds(fraud.run, fraud.step, fraud.guilty, fraud.digest):
        why = "held"
    if why is None and not bearing.fits(fraud):
        why = "run_full"
    if why is not None:
        return _verdict(Outcome.IGNORE, why, _WHY[why])
    return Verdict(Outcome.ACCEPT, "convicts " + ", ".join(fraud.to_json()["guilty"]), message=fraud)


def judge_fraud_proof(data: bytes, bearing: Bearing, *, max_size: int = MAX_GOSSIP_FRAUD_PROOF) -> Verdict[ProvenFraud]:
    """The gossip verdict on the encoded proof ``data`` (module doc), on the calling thread.
    ``max_size``: the gossip bound, or ``MAX_FRAUD_PROOF_SIZE`` for a body fetched by digest
    and for the node's own proofs."""
    verdict = referee_fraud_proof(data, max_size=max_size)
    return relevant_fraud(verdict.message, bearing) if verdict.accepted else verdict
