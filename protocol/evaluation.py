"""Certified evaluation (docs/protocol.md §5.3 ``eval``, §7, §8.5): a run's evaluation losses,
published by its trainer and recomputed by anyone.

A run that commits to an evaluation set and schedule (its manifest's ``data`` map: ``eval_root``,
``eval_samples``, ``eval_every``, docs/run-format.md §9) is evaluated at states k = E, 2E, … ≤ S.
Its publisher signs one ``eval`` statement with verdict ``result`` per state (the float32 bits of
the loss); any node recomputes the loss with the engine and signs ``match`` or ``mismatch``
against the result it checked (``claimed``). :func:`evaluations` turns the set of statements into
a status per scheduled state — certified, disputed or unchecked — as a pure function of the set
and the trust policy, like :func:`~.coverage.coverage`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, ClassVar, Iterable, Mapping

from .errors import InvalidStatementError, ProtocolError, WrongTypeError
from .identity import PUBLIC_KEY_SIZE, peer_id_from_public_key
from .messages import DEVICE_CLASS, HASH_SIZE, MATCH, MAX_DEVICE_CLASS, MISMATCH, SignedMessage
from .schema import Bytes, Enum, FieldType, Text, UInt

MAX_EVAL_SIZE = 512
RESULT = "result"
_F32 = (1 << 32) - 1


class EvalStatus(str, enum.Enum):
    UNCHECKED = "unchecked"  # no result yet, or fewer matching keys than asked for
    CERTIFIED = "certified"  # the result, and at least `min_keys` counted keys recomputed it
    DISPUTED = "disputed"  # a counted key recomputed another loss, or the publisher signed two results


@dataclass(frozen=True)
class EvalStatement(SignedMessage):
    """"The evaluation loss of state ``state`` of ``run`` is ``loss``" (verdict ``result``, by the
    run's publisher) or "I recomputed it: ``loss``, which matches / does not match ``claimed``"."""

    KIND: ClassVar[str] = "eval"
    MAX_SIZE: ClassVar[int] = MAX_EVAL_SIZE
    SIGNER: ClassVar[str] = "signer"
    SCHEMA: ClassVar[Mapping[str, FieldType]] = {
        "run": Bytes(size=HASH_SIZE),
        "state": UInt(),
        "loss": UInt(maximum=_F32),
        "claimed": UInt(maximum=_F32),
        "verdict": Enum(frozenset({RESULT, MATCH, MISMATCH})),
        "engine": Text(max_length=64),
        "engine_version": Text(max_length=64),
        "device": Text(max_length=MAX_DEVICE_CLASS),
        "signer": Bytes(size=PUBLIC_KEY_SIZE),
        "issued_at": UInt(),
    }

    run: bytes
    state: int
    loss: int  # float32 bits of the signer's loss
    claimed: int  # float32 bits of the result judged (a result: its own loss)
    verdict: str
    engine: str
    engine_version: str
    device: str
    signer: bytes
    issued_at: int

    def _check_semantics(self) -> None:
        if (self.verdict == MISMATCH) == (self.loss == self.claimed):
            raise WrongTypeError("eval: a result or match has loss = claimed, a mismatch loss != claimed",
                                 code="eval_verdict")
        if not DEVICE_CLASS.fullmatch(self.device):
            raise WrongTypeError(f"eval: {self.device!r} is not a device class", code="device")


def eval_schedule(run: Any) -> list[int]:
    """The states ``run`` evaluates (empty when it commits to no evaluation): k = E, 2E, … ≤ steps."""
    data = getattr(run, "data", None) or {}
    every, root = data.get("eval_every"), data.get("eval_root")
    if type(every) is not int or every < 1 or type(root) is not str:
        return []
    return list(range(every, run.steps + 1, every))


def check_eval(ev: EvalStatement, run: Any) -> None:
    """Raise unless ``ev`` is consistent with the run it refers to (docs/protocol.md §7)."""
    # [REJECT] the run commits to an evaluation set and schedule
    schedule = eval_schedule(run)
    if not schedule:
        raise InvalidStatementError("the run commits to no evaluation", code="no_eval")
    # [REJECT] the state is on the schedule
    if ev.state not in schedule:
        raise InvalidStatementError(f"state {ev.state} is not on the run's evaluation schedule", code="eval_state")
    # [REJECT] the engine is the one the run names
    if (ev.engine, ev.engine_version) != (run.engine, run.engine_version):
        raise InvalidStatementError("engine differs from the run's engine", code="engine")
    # [REJECT] a result is signed by the run's publisher, and a match or mismatch by anyone else
    if (ev.verdict == RESULT) != (ev.signer == getattr(run, "publisher", None)):
        raise InvalidStatementError("results come from the publisher, checks from other keys", code="eval_signer")


@dataclass(frozen=True)
class EvalCoverage:
    state: int
    status: EvalStatus
    loss: int | None  # float32 bits of the publisher's result (None: none, or two of them)
    checkers: tuple[str, ...]  # peer IDs of counted keys whose match recomputed the result, sorted
    dissenters: tuple[str, ...]  # peer IDs of counted keys that recomputed another loss, sorted
    evidence: tuple[bytes, ...] = ()  # digests of the mismatches, or of the publisher's results, sorted
    devices: tuple[str, ...] = ()  # device classes of the counted matches, sorted


def evaluations(run: Any, statements: Iterable[EvalStatement], *, policy: Any = None,
                min_keys: int = 1) -> tuple[EvalCoverage, ...]:
    """Status of every scheduled evaluation of ``run`` (docs/protocol.md §8.5), in state order.
    ``policy`` is a :class:`~.coverage.TrustPolicy` (default: every key counts)."""
    if min_keys < 1:
        raise ValueError("min_keys must be at least 1")

    def trusted(key: bytes) -> bool:
        return policy is None or policy.trusts(key)

    # 1. The statements about this run that pass its rules (§7).
    valid = [e for e in statements if e.run == run.run_id and _ok(e, run)]
    out = []
    for k in eval_schedule(run):
        at_k = [e for e in valid if e.state == k]
        results = sorted((e for e in at_k if e.verdict == RESULT), key=lambda e: e.digest)
        losses = {e.loss for e in results}
        # 2. No result: unchecked. Two results: the publisher contradicted itself.
        if len(losses) != 1:
            status = EvalStatus.DISPUTED if losses else EvalStatus.UNCHECKED
            out.append(EvalCoverage(k, status, None, (), (), tuple(e.digest for e in results)))
            continue
        (loss,) = losses
        # 3. Checks of that result by counted keys; a check of another number judges nothing published.
        checks = [e for e in at_k if e.verdict != RESULT and e.claimed == loss and trusted(e.signer)]
        matches = [e for e in checks if e.verdict == MATCH]
        mismatches = sorted((e for e in checks if e.verdict == MISMATCH), key=lambda e: e.digest)
        checkers = tuple(sorted({peer_id_from_public_key(e.signer) for e in matches}))
        dissenters = tuple(sorted({peer_id_from_public_key(e.signer) for e in mismatches}))
        # 4. Any counted mismatch disputes it; else min_keys matching keys certify it.
        status = (EvalStatus.DISPUTED if mismatches else EvalStatus.CERTIFIED if len(checkers) >= min_keys
                  else EvalStatus.UNCHECKED)  # fmt: skip
        out.append(EvalCoverage(k, status, loss, checkers, dissenters, tuple(e.digest for e in mismatches),
                                tuple(sorted({e.device for e in matches}))))  # fmt: skip
    return tuple(out)


def _ok(ev: EvalStatement, run: Any) -> bool:
    try:
        check_eval(ev, run)
    except ProtocolError:
        return False
    return True
