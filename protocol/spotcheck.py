"""Spot checks (docs/protocol.md §5.5, §7, §8.7): a cheap, exact check of one step, stated as its
own kind so that it never counts as a replay (design invariant 10).

A verifier derives its challenge of step k from two of its own Ed25519 signatures over (run, k):
in the domain ``spotcheck-challenge`` the gradient ``chunks`` it asks the trainer for
(:func:`challenge_signature`, :func:`derive_chunks`), and in the domain ``spotcheck-slot`` the
(rank, micro-batch) ``slot`` it recomputes (:func:`slot_signature`, :func:`derive_slot`). Both are
unknown to the trainer when it published, unique to the verifier's key and checkable by anyone;
the slot's signature is revealed only in the ``spotcheck``, after the trainer has answered, so the
trainer answers every slot's chunks without knowing which one is compared with a recomputation
(docs/run-format.md §10). The verifier then signs a ``spotcheck``
with verdict ``pass`` or ``fail`` and ``caught``, the link that failed. :func:`spot_coverage`
turns the set of them into a status per step — unchecked, spot checked, failed — and the
probability that a forged run escaped (:mod:`.escape`), as a pure function of the set and the
trust policy.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, ClassVar, Iterable, Mapping

from . import signing
from .errors import InvalidStatementError, ProtocolError, SignatureError, WrongTypeError
from .escape import escape_probability, forged_steps_at
from .hashing import blake2b256
from .identity import PUBLIC_KEY_SIZE, SIGNATURE_SIZE, Identity, peer_id_from_public_key
from .messages import DEVICE_CLASS, HASH_SIZE, MAX_DEVICE_CLASS, SignedMessage
from .schema import Bytes, Enum, FieldType, ListOf, Text, UInt

MAX_SPOTCHECK_SIZE = 1024
CHALLENGE_KIND = "spotcheck-challenge"
SLOT_KIND = "spotcheck-slot"
CHALLENGE_CHUNKS = 4
"""Gradient chunks one challenge opens (fewer when the gradient has fewer)."""
ANSWER_SECONDS = 3600
"""How long a trainer has to answer a challenge before the verifier signs ``fail``/``no_answer``
(docs/protocol.md §5.5): at most one recomputation of a step, which is about an hour on an H100."""
MAX_ANSWER_SIZE = 1 << 26
"""Bytes of a trainer's answer to one challenge (docs/run-format.md §10.2): the challenged chunks
(64 KiB each) of every slot's gradient and of the sum, the sum's with its audit path. 64 MiB holds
CHALLENGE_CHUNKS openings for up to 254 slots (ranks × micro_batches); a run with more slots
cannot be spot checked."""
PASS, FAIL = "pass", "fail"
CAUGHT = ("none", "loss", "gradient", "loss_sum", "proof", "sum", "update", "no_answer")
"""The link a spot check found broken (docs/run-format.md §10.3), ``none`` for a pass."""
ESCAPE_FRACTION = 0.01
"""Coverage reports the escape probability for one forged step and for this fraction of them."""


class SpotStatus(str, enum.Enum):
    UNCHECKED = "unchecked"  # no counted spot check
    SPOT_CHECKED = "spot_checked"  # counted spot checks, every one passed: *not* replayed
    FAILED = "failed"  # a counted spot check caught a broken link


@dataclass(frozen=True)
class SpotCheck(SignedMessage):
    """"I spot checked ``step`` of ``run``: chunks ``chunks`` derived from ``challenge``, slot
    ``slot`` derived from ``slot_challenge``; every link held (``pass``) or ``caught`` broke (``fail``)"."""

    KIND: ClassVar[str] = "spotcheck"
    MAX_SIZE: ClassVar[int] = MAX_SPOTCHECK_SIZE
    SIGNER: ClassVar[str] = "signer"
    SCHEMA: ClassVar[Mapping[str, FieldType]] = {
        "run": Bytes(size=HASH_SIZE),
        "step": UInt(),
        "pre_state": Bytes(size=HASH_SIZE),
        "fingerprint": Bytes(size=HASH_SIZE),
        "challenge": Bytes(size=SIGNATURE_SIZE),
        "slot_challenge": Bytes(size=SIGNATURE_SIZE),
        "slot": UInt(),
        "chunks_total": UInt(),
        "chunks": ListOf(UInt(), max_length=CHALLENGE_CHUNKS),
        "verdict": Enum(frozenset({PASS, FAIL})),
        "caught": Enum(frozenset(CAUGHT)),
        "engine": Text(max_length=64),
        "engine_version": Text(max_length=64),
        "device": Text(max_length=MAX_DEVICE_CLASS),
        "elapsed_ms": UInt(),
        "signer": Bytes(size=PUBLIC_KEY_SIZE),
        "issued_at": UInt(),
    }

    run: bytes
    step: int
    pre_state: bytes  # h_step, the checkpoint the slot was recomputed from
    fingerprint: bytes  # F_step, the fingerprint checked against
    challenge: bytes  # the signer's signature over (run, step): the chunks' only randomness
    slot_challenge: bytes  # its signature over (run, step) in the slot domain, secret until the answer
    slot: int  # rank * micro_batches + micro_batch
    chunks_total: int  # the engine's chunk count for the run's model
    chunks: list[int]
    verdict: str
    caught: str
    engine: str
    engine_version: str
    device: str
    elapsed_ms: int
    signer: bytes
    issued_at: int

    def _check_semantics(self) -> None:
        if (self.verdict == PASS) != (self.caught == "none"):
            raise WrongTypeError("spotcheck: a pass catches nothing, a fail names the link", code="spot_verdict")
        if not DEVICE_CLASS.fullmatch(self.device):
            raise WrongTypeError(f"spotcheck: {self.device!r} is not a device class", code="device")


def challenge_signature(identity: Identity, run: bytes, step: int) -> bytes:
    """The verifier's challenge of step ``step``: its signature over (run, step), sent to the trainer."""
    return signing.sign(identity, CHALLENGE_KIND, {"run": run, "step": step})


def slot_signature(identity: Identity, run: bytes, step: int) -> bytes:
    """The verifier's secret slot of step ``step``: its signature over (run, step) in the slot
    domain, revealed only in its ``spotcheck``."""
    return signing.sign(identity, SLOT_KIND, {"run": run, "step": step})


def _seed(signature: bytes) -> bytes:
    return blake2b256(b"open1b/spotcheck/v1\x00", signature)


def derive_chunks(challenge: bytes, chunks_total: int) -> tuple[int, ...]:
    """The sorted chunks a challenge selects (docs/protocol.md §5.5): the first
    min(CHALLENGE_CHUNKS, chunks_total) distinct values of B2(seed ‖ u64be(i)) mod chunks_total for
    i = 0, 1, … (a 256-bit value mod a small count: no measurable bias)."""
    if chunks_total < 1:
        raise ValueError("a gradient has at least one chunk")
    seed, chunks, i = _seed(challenge), set(), 0
    while len(chunks) < min(CHALLENGE_CHUNKS, chunks_total):
        chunks.add(int.from_bytes(blake2b256(seed, i.to_bytes(8, "big")), "big") % chunks_total)
        i += 1
    return tuple(sorted(chunks))


def derive_slot(slot_challenge: bytes, slots: int) -> int:
    """The slot a slot signature selects (docs/protocol.md §5.5): B2(seed ‖ "slot") mod slots."""
    if slots < 1:
        raise ValueError("a step has at least one slot")
    return int.from_bytes(blake2b256(_seed(slot_challenge), b"slot"), "big") % slots


def run_slots(run: Any) -> int:
    """ranks × micro_batches of the run's ``model`` map (docs/run-format.md §3); 0 if it names none."""
    model = getattr(run, "model", None) or {}
    ranks, micro = model.get("ranks"), model.get("micro_batches")
    return ranks * micro if type(ranks) is int and type(micro) is int and ranks > 0 and micro > 0 else 0


def check_spotcheck(sc: SpotCheck, run: Any) -> None:
    """Raise unless ``sc`` is consistent with the run it refers to (docs/protocol.md §7)."""
    # [REJECT] the step exists in the run
    if sc.step >= run.steps:
        raise InvalidStatementError(f"step {sc.step} is outside the run's {run.steps} steps", code="step_range")
    # [REJECT] the slot was recomputed from the published state h_step
    if sc.pre_state != run.state_hashes[sc.step]:
        raise InvalidStatementError("pre_state is not the run's published state hash", code="pre_state")
    # [REJECT] the engine is the one the run names
    if (sc.engine, sc.engine_version) != (run.engine, run.engine_version):
        raise InvalidStatementError("engine differs from the run's engine", code="engine")
    # [REJECT] the challenge is the signer's signature over (run, step)
    try:
        signing.verify(sc.signer, CHALLENGE_KIND, {"run": sc.run, "step": sc.step}, sc.challenge)
    except SignatureError as exc:
        raise InvalidStatementError("challenge is not the signer's signature over (run, step)",
                                    code="challenge") from exc
    # [REJECT] the slot challenge is the signer's signature over (run, step) in the slot domain
    try:
        signing.verify(sc.signer, SLOT_KIND, {"run": sc.run, "step": sc.step}, sc.slot_challenge)
    except SignatureError as exc:
        raise InvalidStatementError("slot_challenge is not the signer's slot signature over (run, step)",
                                    code="challenge") from exc
    # [REJECT] the run names its topology, and the slot and chunks are those the challenges derive
    slots = run_slots(run)
    if (not slots or sc.chunks_total < 1 or sc.slot != derive_slot(sc.slot_challenge, slots)
            or tuple(sc.chunks) != derive_chunks(sc.challenge, sc.chunks_total)):
        raise InvalidStatementError("slot and chunks are not the challenges'", code="challenge_derivation")


@dataclass(frozen=True)
class StepSpotCoverage:
    step: int
    status: SpotStatus
    checkers: tuple[str, ...]  # peer IDs of counted keys whose spot check passed, sorted
    caught: tuple[str, ...] = ()  # the links counted failures caught, sorted
    evidence: tuple[bytes, ...] = ()  # digests of the counted failures, sorted


@dataclass(frozen=True)
class SpotCoverage:
    run: bytes
    steps: tuple[StepSpotCoverage, ...]
    detection: float  # per-check probability of catching a forged step (docs/run-format.md §10.3)
    escape_one: float  # P(a run with one forged step escaped every check so far)
    escape_fraction: float  # the same with ESCAPE_FRACTION of the steps forged

    def count(self, status: SpotStatus) -> int:
        return sum(1 for s in self.steps if s.status is status)

    @property
    def failed_steps(self) -> list[int]:
        return [s.step for s in self.steps if s.status is SpotStatus.FAILED]


def spot_coverage(run: Any, statements: Iterable[SpotCheck], *, policy: Any = None,
                  replayed: Iterable[int] = ()) -> SpotCoverage:
    """Spot-check status of every step of ``run`` (docs/protocol.md §8.7) and its escape
    probabilities. ``replayed``: the steps replay coverage decided, verified or refuted
    (:attr:`~.coverage.Coverage.replayed_steps`). ``policy`` is a :class:`~.coverage.TrustPolicy`
    (default: every key counts). Only the statements and the policy decide: nothing here asks the
    engine, so two nodes with the same statements report the same numbers."""
    # 1. The statements about this run that pass its rules (§7), by counted keys.
    valid = [s for s in statements if s.run == run.run_id and _ok(s, run)
             and (policy is None or policy.trusts(s.signer))]
    per_step: list[list[SpotCheck]] = [[] for _ in range(run.steps)]
    for s in valid:
        per_step[s.step].append(s)
    out, checks = [], []
    for k, at_k in enumerate(per_step):
        fails = sorted({s.digest: s for s in at_k if s.verdict == FAIL}.values(), key=lambda s: s.digest)
        passers = {s.signer for s in at_k if s.verdict == PASS}
        # 2. A check is one key's challenge: a key that signs twice checked the same slot and chunks.
        #    A failed step still lists its passes: they were checks, and a later fail does not undo them.
        checks.append(len(passers))
        status = SpotStatus.FAILED if fails else SpotStatus.SPOT_CHECKED if passers else SpotStatus.UNCHECKED
        out.append(StepSpotCoverage(k, status, tuple(sorted(peer_id_from_public_key(p) for p in passers)),
                                    tuple(sorted({s.caught for s in fails})), tuple(s.digest for s in fails)))
    # 3-4. The escape probabilities, with one check per counted key and step. A step that replay
    #      decided or a spot check failed is caught: a forgery there did not go unnoticed.
    p = detection_per_check(run)
    caught = set(replayed) | {s.step for s in out if s.status is SpotStatus.FAILED}
    return SpotCoverage(run.run_id, tuple(out), p, escape_probability(checks, p, 1, caught),
                        escape_probability(checks, p, forged_steps_at(ESCAPE_FRACTION, run.steps), caught))


def detection_per_check(run: Any) -> float:
    """The least probability that one spot check of a forged step catches it, over the forgeries
    of docs/run-format.md §10.3: 1 / (ranks × micro_batches), the forged micro-batch's; 0 for a
    run whose ``model`` map names no topology (no spot check of it is valid, §7)."""
    slots = run_slots(run)
    return 1.0 / slots if slots else 0.0


def _ok(sc: SpotCheck, run: Any) -> bool:
    try:
        check_spotcheck(sc, run)
    except ProtocolError:
        return False
    return True
