"""Gossip validation: bytes from a peer → accept, reject (penalise the sender) or ignore.

Each rule is a comment ``[REJECT]``/``[IGNORE]`` above the check that enforces it, in the order
they are applied (the order matters: nothing is looked up for bytes that do not authenticate).
The node's gossip validators, its sync protocol and the coverage function all go through here,
so there is one definition of a valid statement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Generic, TypeVar

from .claims import MAX_LEASE_SECONDS
from .errors import InvalidStatementError, Outcome, ProtocolError, UnjudgeableError
from .messages import MATCH, Attestation, Claim, RunManifest, SignedMessage

# A statement dated further in the future than this is ignored, not rejected: the clocks of
# honest nodes disagree by seconds, and the statement may become judgeable later.
MAX_CLOCK_SKEW_SECONDS = 120

ManifestLookup = Callable[[bytes], "RunManifest | None"]
T = TypeVar("T", bound=SignedMessage)


@dataclass(frozen=True)
class Verdict(Generic[T]):
    outcome: Outcome
    reason: str
    message: T | None = None

    @property
    def accepted(self) -> bool:
        return self.outcome is Outcome.ACCEPT


def check_attestation(att: Attestation, manifest: RunManifest) -> None:
    """Raise unless ``att`` is consistent with the run it refers to."""
    # [REJECT] the step exists in the run
    if att.step >= manifest.steps:
        raise InvalidStatementError(f"step {att.step} is outside the run's {manifest.steps} steps")
    # [REJECT] the replay started from the published state h_step
    if att.pre_state != manifest.state_hashes[att.step]:
        raise InvalidStatementError("pre_state is not the run's published state hash")
    # [REJECT] the verdict is what comparing post_state with h_{step+1} gives
    published = manifest.state_hashes[att.step + 1]
    if (att.verdict == MATCH) != (att.post_state == published):
        raise InvalidStatementError("verdict contradicts the post_state it reports")
    # [REJECT] the engine is the one the run names (a node never approximates another engine)
    if (att.engine, att.engine_version) != (manifest.engine, manifest.engine_version):
        raise InvalidStatementError("engine differs from the run's engine")


def check_claim(claim: Claim, manifest: RunManifest) -> None:
    # [REJECT] the step exists in the run
    if claim.step >= manifest.steps:
        raise InvalidStatementError(f"step {claim.step} is outside the run's {manifest.steps} steps")
    # [REJECT] the lease is not longer than the protocol allows
    if claim.lease_expiry - claim.issued_at > MAX_LEASE_SECONDS:
        raise InvalidStatementError("lease longer than MAX_LEASE_SECONDS")


def _check_not_future(issued_at: int, now: int) -> None:
    # [IGNORE] the statement is not dated in the future beyond the tolerated clock skew
    if issued_at > now + MAX_CLOCK_SKEW_SECONDS:
        raise UnjudgeableError("issued in the future")


def validate_attestation(data: bytes, manifests: ManifestLookup, now: int) -> Verdict[Attestation]:
    try:
        # [REJECT] size, canonical CBOR, schema and signature (Attestation.decode)
        att = Attestation.decode(data)
        # [IGNORE] the run is known locally
        manifest = manifests(att.run)
        if manifest is None:
            raise UnjudgeableError("unknown run")
        _check_not_future(att.issued_at, now)
        check_attestation(att, manifest)
    except ProtocolError as exc:
        return Verdict(exc.outcome, f"{type(exc).__name__}: {exc}")
    return Verdict(Outcome.ACCEPT, "ok", att)


def validate_claim(data: bytes, manifests: ManifestLookup, now: int) -> Verdict[Claim]:
    try:
        # [REJECT] size, canonical CBOR, schema, lease after issue, signature (Claim.decode)
        claim = Claim.decode(data)
        # [IGNORE] the run is known locally
        manifest = manifests(claim.run)
        if manifest is None:
            raise UnjudgeableError("unknown run")
        _check_not_future(claim.issued_at, now)
        check_claim(claim, manifest)
    except ProtocolError as exc:
        return Verdict(exc.outcome, f"{type(exc).__name__}: {exc}")
    return Verdict(Outcome.ACCEPT, "ok", claim)


def validate_manifest(data: bytes, now: int) -> Verdict[RunManifest]:
    try:
        # [REJECT] size, canonical CBOR, schema, hash-chain length, signature (RunManifest.decode)
        manifest = RunManifest.decode(data)
        _check_not_future(manifest.created_at, now)
    except ProtocolError as exc:
        return Verdict(exc.outcome, f"{type(exc).__name__}: {exc}")
    return Verdict(Outcome.ACCEPT, "ok", manifest)
