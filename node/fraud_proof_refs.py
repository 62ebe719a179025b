"""Fraud proof references (docs/protocol.md §18.7): how a proof larger than a gossip message
travels. A proof reads whole tensors when its disputed row does (a product's weight, the update's
state chunks: 1–8 MB at ``small``, tens of MB at ``gpt-1b``), and a gossip message holds 1 MiB.
For such a proof a node gossips a :class:`FraudProofRef` — run, step, digest, size and the keys it
convicts, unsigned: every claim in it is checked against the body it names — and a peer that
wants the proof fetches the body by digest from the node that told it (node/fraud_proof_fetch.py).

:func:`judge_fraud_proof_ref` is the cheap rule a reference passes before anything is fetched, in
order (``[REJECT]`` penalises the sender, ``[IGNORE]`` does not):

- ``[REJECT]`` more than :data:`MAX_FRAUD_PROOF_REF` bytes, not canonical CBOR, not the schema
  (``kind``, ``v`` = 1, ``run``, ``step``, ``digest``, ``size``, ``guilty``: one or two 32-byte
  keys, strictly ascending) — the codes of §3.2;
- ``[REJECT]`` ``size`` not above ``MAX_GOSSIP_FRAUD_PROOF`` or above ``MAX_FRAUD_PROOF_SIZE`` —
  ``ref_size`` (a proof that fits a gossip message travels whole; a larger one the referee refuses);
- ``[IGNORE]`` a run this node does not know — ``unknown_run``;
- ``[REJECT]`` a step outside the run — ``step_range``;
- ``[IGNORE]`` no key of ``guilty`` is the run's publisher or has a stored attestation of the
  step — ``not_attested``, or none that attested counts here — ``not_counted`` (the gossip rules
  of the proof itself, node/fraud_proofs.py, judged before fetching it);
- ``[IGNORE]`` the node keeps this proof, or for every key of ``guilty`` one that makes it add
  nothing — ``held`` (node/fraud_proof_store.py: one proof per conviction, the lowest digest);
- ``[IGNORE]`` the run's bound would not keep it — ``run_full`` (node/fraud_proof_store.py).

A reference that passes is *wanted*: the body is fetched, checked against ``size`` and
``digest``, judged by :func:`~.fraud_proofs.judge_fraud_proof` as a gossiped proof is (with the
referee's bound), and must convict exactly ``guilty`` at ``run`` and ``step`` — ``ref_mismatch``
otherwise: the sender named bytes that say something else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

from open1b.protocol import Outcome
from open1b.protocol.codec import decode, encode
from open1b.protocol.dispute import MAX_FRAUD_PROOF_SIZE
from open1b.protocol.errors import InvalidStatementError, ProtocolError, WrongTypeError
from open1b.protocol.schema import Bytes, Enum, ListOf, UInt, check_map
from open1b.protocol.validation import Verdict

from .fraud_proofs import MAX_GOSSIP_FRAUD_PROOF, Bearing, FraudRecord

MAX_FRAUD_PROOF_REF = 256
"""Bytes of an encoded reference (~190 with two guilty keys)."""

_SCHEMA = {"kind": Enum(frozenset({"fraud_proof_ref"})), "v": UInt(), "run": Bytes(32), "step": UInt(),
           "digest": Bytes(32), "size": UInt(), "guilty": ListOf(Bytes(32), 2)}


@dataclass(frozen=True)
class FraudProofRef:
    """A proof of ``size`` bytes whose B2 is ``digest``, convicting ``guilty`` (ascending) at
    ``run``'s step ``step``."""

    KIND: ClassVar[str] = "fraud_proof_ref"

    run: bytes
    step: int
    digest: bytes
    size: int
    guilty: tuple[bytes, ...]

    @classmethod
    def of(cls, fraud: FraudRecord) -> FraudProofRef:
        return cls(fraud.run, fraud.step, fraud.digest, fraud.size, tuple(sorted(fraud.guilty)))

    @property
    def encoded(self) -> bytes:
        return encode({"kind": self.KIND, "v": 1, "run": self.run, "step": self.step, "digest": self.digest,
                       "size": self.size, "guilty": list(self.guilty)})

    @classmethod
    def decode(cls, data: bytes) -> FraudProofRef:
        """The reference in ``data``; a :class:`ProtocolError` (with its §3.2 code) if it is not one."""
        value = decode(data, max_size=MAX_FRAUD_PROOF_REF)
        if type(value) is dict and value.get("kind") != cls.KIND:
            raise WrongTypeError("not a fraud proof reference", code="kind")
        check_map(_SCHEMA, value, "fraud_proof_ref")
        if value["v"] != 1:
            raise InvalidStatementError(f"version {value['v']}", code="version")
        guilty = tuple(value["guilty"])
        if not guilty or list(guilty) != sorted(set(guilty)):
            raise WrongTypeError("fraud_proof_ref.guilty: one or two keys, strictly ascending")
        return cls(value["run"], value["step"], value["digest"], value["size"], guilty)

    def describes(self, fraud: FraudRecord) -> bool:
        """Whether ``fraud`` is the proof this reference names and convicts whom it says."""
        return self == FraudProofRef.of(fraud)


class ProofRefs(Protocol):
    """What takes the references a node hears (node/fraud_proof_fetch.py's ProofFetcher)."""

    def gossiped(self, author: str, data: bytes) -> Outcome:
        """The gossip validator of the run's references topic."""

    def synced(self, data: bytes, source: str) -> None:
        """A reference a sync response from ``source`` carried."""


def is_large(fraud: FraudRecord) -> bool:
    """Whether ``fraud`` travels as a reference (over the gossip bound) rather than whole."""
    return fraud.size > MAX_GOSSIP_FRAUD_PROOF


def _verdict(outcome: Outcome, code: str, reason: str) -> Verdict[FraudProofRef]:
    return Verdict(outcome, reason, code=code)


def judge_fraud_proof_ref(data: bytes, bearing: Bearing) -> Verdict[FraudProofRef]:
    """The verdict on the encoded reference ``data`` (module doc): ACCEPT means "fetch it"."""
    try:
        ref = FraudProofRef.decode(data)
    except ProtocolError as exc:
        return _verdict(exc.outcome, exc.code, f"{type(exc).__name__}: {exc}")
    if not MAX_GOSSIP_FRAUD_PROOF < ref.size <= MAX_FRAUD_PROOF_SIZE:
        return _verdict(Outcome.REJECT, "ref_size",
                        f"a proof of {ref.size} bytes travels whole or not at all, not by reference")
    manifest = bearing.manifest_of(ref.run)
    if manifest is None:
        return _verdict(Outcome.IGNORE, "unknown_run", "a run this node does not know")
    if ref.step >= manifest.steps:
        return _verdict(Outcome.REJECT, "step_range", f"step {ref.step} is outside the run's {manifest.steps} steps")
    why = bearing.bears(ref.run, ref.step, ref.guilty, manifest.publisher)
    if why is not None:
        return _verdict(Outcome.IGNORE, why, "no guilty key published the run or attested the step and counts here")
    if bearing.holds(ref.run, ref.step, ref.guilty, ref.digest):
        return _verdict(Outcome.IGNORE, "held", "this node keeps that proof or a lower digest of each conviction")
    if not bearing.fits(ref):
        return _verdict(Outcome.IGNORE, "run_full", "the run's bound would not keep it")
    return Verdict(Outcome.ACCEPT, "wanted", message=ref)

