"""Gossip validation: bytes from a peer → accept, reject (penalise the sender) or ignore.

Each rule is a comment ``[REJECT]``/``[IGNORE]`` above the check that enforces it, in the order
they are applied (the order matters: nothing is looked up for bytes that do not authenticate).
The node's gossip validators, its sync protocol and the coverage function all go through here,
so there is one definition of a valid statement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Generic, Protocol, Sequence, TypeVar

from .claims import MAX_LEASE_SECONDS
from .codec import decode
from .evaluation import EvalStatement, check_eval
from .errors import InvalidStatementError, Outcome, ProtocolError, UnjudgeableError, WrongTypeError
from .messages import MATCH, Attestation, Claim, RunManifest, SignedMessage
from .spotcheck import SpotCheck, check_spotcheck
from .trajectory import ExternalRunManifest
from .witness import WitnessReveal, witness_commitment

MESSAGE_TYPES: dict[str, type[SignedMessage]] = {
    cls.KIND: cls for cls in (RunManifest, ExternalRunManifest, Claim, Attestation, WitnessReveal, EvalStatement,
                           SpotCheck)
}

# A statement dated further in the future than this is ignored, not rejected: the clocks of
# honest nodes disagree by seconds, and the statement may become judgeable later.
MAX_CLOCK_SKEW_SECONDS = 120


class Run(Protocol):
    """What validation and coverage need to know about a run: a :class:`RunManifest` is one, and
    so is an :class:`~open1b.protocol.trajectory.ExternalRun` (a manifest whose state hashes
    live in an external trajectory file, resolved against its commitment)."""

    @property
    def run_id(self) -> bytes: ...
    @property
    def steps(self) -> int: ...
    @property
    def state_hashes(self) -> Sequence[bytes]: ...
    @property
    def engine(self) -> str: ...
    @property
    def engine_version(self) -> str: ...
    @property
    def publisher(self) -> bytes: ...  # the key a conviction of which refutes a step (coverage)


RunLookup = Callable[[bytes], "Run | None"]
ManifestLookup = RunLookup  # the name node/ has used
T = TypeVar("T", bound=SignedMessage)


@dataclass(frozen=True)
class Verdict(Generic[T]):
    outcome: Outcome
    reason: str
    message: T | None = None
    code: str = "ok"  # the rule's reason code (docs/protocol.md), "ok" when accepted

    @property
    def accepted(self) -> bool:
        return self.outcome is Outcome.ACCEPT


def check_attestation(att: Attestation, manifest: Run) -> None:
    """Raise unless ``att`` is consistent with the run it refers to."""
    # [REJECT] the step exists in the run
    if att.step >= manifest.steps:
        raise InvalidStatementError(f"step {att.step} is outside the run's {manifest.steps} steps", code="step_range")
    # [REJECT] the replay started from the published state h_step
    if att.pre_state != manifest.state_hashes[att.step]:
        raise InvalidStatementError("pre_state is not the run's published state hash", code="pre_state")
    # [REJECT] the verdict is what comparing post_state with h_{step+1} gives
    published = manifest.state_hashes[att.step + 1]
    if (att.verdict == MATCH) != (att.post_state == published):
        raise InvalidStatementError("verdict contradicts the post_state it reports", code="verdict")
    # [REJECT] the engine is the one the run names (a node never approximates another engine)
    if (att.engine, att.engine_version) != (manifest.engine, manifest.engine_version):
        raise InvalidStatementError("engine differs from the run's engine", code="engine")


def check_claim(claim: Claim, manifest: Run) -> None:
    # [REJECT] the step exists in the run
    if claim.step >= manifest.steps:
        raise InvalidStatementError(f"step {claim.step} is outside the run's {manifest.steps} steps", code="step_range")
    # [REJECT] the lease is not longer than the protocol allows
    if claim.lease_expiry - claim.issued_at > MAX_LEASE_SECONDS:
        raise InvalidStatementError("lease longer than MAX_LEASE_SECONDS", code="lease_length")


def check_reveal(reveal: WitnessReveal, manifest: Run) -> None:
    # [REJECT] the step exists in the run
    if reveal.step >= manifest.steps:
        raise InvalidStatementError(f"step {reveal.step} is outside the run's {manifest.steps} steps", code="step_range")
    # [REJECT] the witness opens the run's commitment C_step (a run without commitments has none to open)
    commitments = getattr(manifest, "witnesses", None)
    if commitments is None or witness_commitment(reveal.witness) != commitments[reveal.step]:
        raise InvalidStatementError("witness does not open the run's commitment C_step", code="witness")


def _check_not_future(issued_at: int, now: int) -> None:
    # [IGNORE] the statement is not dated in the future beyond the tolerated clock skew
    if issued_at > now + MAX_CLOCK_SKEW_SECONDS:
        raise UnjudgeableError("issued in the future", code="future")


def _validate_about_run(decoder: Callable[[bytes], T], check: Callable[[T, Run], None], data: bytes,
                        manifests: RunLookup, now: int) -> Verdict[T]:
    """The rules of a statement about one run: decode, known run, not from the future, then ``check``."""
    try:
        # [REJECT] size, canonical CBOR, schema, cross-field rules and signature (decoder)
        message = decoder(data)
        # [IGNORE] the run is known locally
        manifest = manifests(message.run)  # type: ignore[attr-defined]
        if manifest is None:
            raise UnjudgeableError("unknown run", code="unknown_run")
        _check_not_future(message.issued_at, now)  # type: ignore[attr-defined]
        check(message, manifest)
    except ProtocolError as exc:
        return Verdict(exc.outcome, f"{type(exc).__name__}: {exc}", code=exc.code)
    return Verdict(Outcome.ACCEPT, "ok", message)


def validate_attestation(data: bytes, manifests: RunLookup, now: int) -> Verdict[Attestation]:
    return _validate_about_run(Attestation.decode, check_attestation, data, manifests, now)


def validate_claim(data: bytes, manifests: RunLookup, now: int) -> Verdict[Claim]:
    return _validate_about_run(Claim.decode, check_claim, data, manifests, now)


def validate_reveal(data: bytes, manifests: RunLookup, now: int) -> Verdict[WitnessReveal]:
    return _validate_about_run(WitnessReveal.decode, check_reveal, data, manifests, now)


def validate_eval(data: bytes, manifests: RunLookup, now: int) -> Verdict[EvalStatement]:
    return _validate_about_run(EvalStatement.decode, check_eval, data, manifests, now)


def validate_spotcheck(data: bytes, manifests: RunLookup, now: int) -> Verdict[SpotCheck]:
    return _validate_about_run(SpotCheck.decode, check_spotcheck, data, manifests, now)


def validate_sync_frame(data: bytes, manifests: RunLookup, now: int) -> Verdict[Attestation | WitnessReveal | SpotCheck]:
    """A statement in a sync response (docs/protocol.md §11.1): an attestation, a reveal or a spot
    check, judged as on its gossip topic once its kind is known (size first against the largest
    limit, then its own)."""
    def check(message: Attestation | WitnessReveal | SpotCheck, manifest: Run) -> None:
        if isinstance(message, Attestation):
            check_attestation(message, manifest)
        elif isinstance(message, SpotCheck):
            check_spotcheck(message, manifest)
        else:
            check_reveal(message, manifest)
    return _validate_about_run(lambda d: decode_message(d, _SYNC_KINDS), check, data, manifests, now)


def decode_message(data: bytes, kinds: frozenset[str] | None = None) -> SignedMessage:
    """Decode and authenticate a message of any kind (or of one of ``kinds``), by its ``kind``."""
    expected = MESSAGE_TYPES.keys() if kinds is None else kinds & MESSAGE_TYPES.keys()
    value = decode(data, max_size=max((MESSAGE_TYPES[k].MAX_SIZE for k in expected), default=0))
    kind = value.get("kind") if type(value) is dict else None
    # type first: any CBOR value may stand there, and a list or map is not even hashable
    if type(kind) is not str or kind not in MESSAGE_TYPES or (kinds is not None and kind not in kinds):
        raise WrongTypeError(f"not a message of an expected kind: {kind!r}", code="kind")
    return MESSAGE_TYPES[kind].decode(data)


_MANIFEST_KINDS = frozenset({RunManifest.KIND, ExternalRunManifest.KIND})
_SYNC_KINDS = frozenset({Attestation.KIND, WitnessReveal.KIND, SpotCheck.KIND})


def validate_manifest(data: bytes, now: int) -> Verdict[RunManifest | ExternalRunManifest]:
    try:
        # [REJECT] size, canonical CBOR, schema, hash-chain length, signature (decode_message)
        manifest = decode_message(data, _MANIFEST_KINDS)
        _check_not_future(manifest.created_at, now)
    except ProtocolError as exc:
        return Verdict(exc.outcome, f"{type(exc).__name__}: {exc}", code=exc.code)
    return Verdict(Outcome.ACCEPT, "ok", manifest)
