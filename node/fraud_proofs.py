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
  step — ``not_attested``: the conviction does not bear on this node's coverage (yet). This bounds
  what anyone can make the network carry: a proof needs a key that vouched for the step.

It comes in two halves: :func:`referee_fraud_proof`, the bound and the referee (the costly part,
~15 ms at 1 MiB and seconds at 128 MiB, a function of the bytes alone), which a node runs in a
worker thread (node/referee_worker.py), and :func:`relevant_fraud`, the node's rules after it.

A proof is stored once per (run, step, guilty key) (node/store.py): a second proof of the same
conviction adds nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable, ClassVar

from open1b.protocol import Conviction, Outcome, RunManifest
from open1b.protocol.dispute import FraudProof, FraudVerdict, verify_fraud_proof
from open1b.protocol.hashing import blake2b256
from open1b.protocol.identity import peer_id_from_public_key
from open1b.protocol.validation import Verdict

MAX_GOSSIP_FRAUD_PROOF = (1 << 20) - 4096
"""Bytes of a gossiped fraud proof: p2p.py's MAX_PUBSUB_MESSAGE less the pubsub envelope
(docs/protocol.md §9; spelled out so that the store, which the CLI opens, loads no libp2p)."""


@dataclass(frozen=True)
class ProvenFraud:
    """A fraud proof the referee accepted, about a known run's step: ``guilty`` signed an op
    output that does not follow from inputs it signed as well. ``digest`` is B2 of the proof's
    bytes, how coverage and the API cite it."""

    KIND: ClassVar[str] = "fraud_proof"

    encoded: bytes
    run: bytes
    step: int
    op: str
    position: int
    guilty: tuple[bytes, ...]
    pre_state: bytes
    post_states: tuple[bytes, ...]  # each guilty key's trace's post_state, in the order of ``guilty``

    @cached_property
    def digest(self) -> bytes:  # once: a proof fetched by reference may be 128 MiB (~0.5 s of hashing)
        return blake2b256(self.encoded)

    def convictions(self) -> list[Conviction]:
        """What coverage reads of it (docs/protocol.md §8.3): one conviction per guilty key."""
        return [Conviction(self.run, self.step, k, self.pre_state, post, self.digest)
                for k, post in zip(self.guilty, self.post_states)]

    def to_json(self) -> dict:
        return {"digest": self.digest.hex(), "run": self.run.hex(), "step": self.step, "op": self.op,
                "position": self.position, "guilty": [peer_id_from_public_key(k) for k in self.guilty],
                "bytes": len(self.encoded)}


def proven_fraud(data: bytes) -> ProvenFraud:
    """The referee's conviction in the stored proof ``data`` (judged again: a damaged store file
    cannot make the node cite bytes it did not check); ValueError if it convicts no one."""
    verdict = verify_fraud_proof(data)
    if not verdict.accepted:
        raise ValueError(f"a stored fraud proof no longer convicts: {verdict.reason}")
    return _proven(data, verdict)


def _proven(data: bytes, verdict: FraudVerdict) -> ProvenFraud:
    traces = FraudProof.decode(data).traces  # the referee checked both agree on run, step and pre_state
    post = {t.tracer: t.post_state for t in traces}
    return ProvenFraud(data, verdict.run, verdict.step, verdict.op, verdict.position, verdict.guilty,
                       traces[0].pre_state, tuple(post[k] for k in verdict.guilty))


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
    fraud = _proven(data, verdict)
    _ = fraud.digest  # hashed here too, off the event loop where a node runs this: ~0.5 s at 128 MiB
    return Verdict(Outcome.ACCEPT, "the referee convicts", message=fraud)


def relevant_fraud(fraud: ProvenFraud, manifest_of: Callable[[bytes], RunManifest | None],
                   attested: Callable[[bytes, int, bytes], bool]) -> Verdict[ProvenFraud]:
    """The second half of :func:`judge_fraud_proof`: the node's rules on a proof the referee
    accepted (cheap; they read the node's runs and store)."""
    manifest = manifest_of(fraud.run)
    if manifest is None:
        return _verdict(Outcome.IGNORE, "unknown_run", "a run this node does not know")
    if fraud.step >= manifest.steps or fraud.pre_state != manifest.state_hashes[fraud.step]:
        return _verdict(Outcome.REJECT, "pre_state", "the traces do not start from the run's published state")
    if not any(k == manifest.publisher or attested(fraud.run, fraud.step, k) for k in fraud.guilty):
        return _verdict(Outcome.IGNORE, "not_attested", "no guilty key published the run or attested the step")
    return Verdict(Outcome.ACCEPT, "convicts " + ", ".join(fraud.to_json()["guilty"]), message=fraud)


def judge_fraud_proof(data: bytes, manifest_of: Callable[[bytes], RunManifest | None],
                      attested: Callable[[bytes, int, bytes], bool], *,
                      max_size: int = MAX_GOSSIP_FRAUD_PROOF) -> Verdict[ProvenFraud]:
    """The gossip verdict on the encoded proof ``data`` (module doc), on the calling thread.
    ``attested(run, step, key)``: whether this node stores an attestation of that step by that
    key. ``max_size``: the gossip bound, or ``MAX_FRAUD_PROOF_SIZE`` for a body fetched by digest
    and for the node's own proofs."""
    verdict = referee_fraud_proof(data, max_size=max_size)
    return relevant_fraud(verdict.message, manifest_of, attested) if verdict.accepted else verdict
