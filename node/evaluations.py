"""A node's part in certified evaluation (docs/run-format.md §9, docs/protocol.md §8.5–§8.6):
the publisher signs its run's results, any node checks a result by recomputing it, and the
leaderboard is computed from what the store holds.

Everything here is a function of its arguments (a run directory, a signed manifest, a key, a clock
reading): the daemon decides when to call it and gossips what it returns.
"""

from __future__ import annotations

from pathlib import Path

import cbor2

from open1b.protocol import EvalStatement, Identity, RunManifest, TrustPolicy, leaderboard
from open1b.protocol.evaluation import RESULT, eval_schedule
from open1b.protocol.leaderboard import BoardRow
from open1b.protocol.messages import MATCH, MISMATCH

from .store import Store

MAX_EVALUATIONS_FILE = 1 << 20
"""``RUN/evaluations.cbor`` larger than this (1 MiB) is refused before it is read."""


class EvaluationError(ValueError):
    """The run directory's evaluation results are missing or do not fit the run's schedule."""


def read_results(run_dir: Path, manifest: RunManifest) -> dict[int, int]:
    """The trainer's results, ``{state: float32 loss bits}``, one per scheduled state."""
    from open1b.deterministic.runfile import EVALUATIONS_FILE

    path = Path(run_dir) / EVALUATIONS_FILE
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_EVALUATIONS_FILE + 1)
    except OSError as exc:
        raise EvaluationError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        if len(data) > MAX_EVALUATIONS_FILE:
            raise ValueError("too large")
        pairs = cbor2.loads(data)
        results = {k: bits for k, bits in pairs if type(k) is int and type(bits) is int and 0 <= bits < 1 << 32}
    except (ValueError, TypeError, cbor2.CBORDecodeError) as exc:
        raise EvaluationError(f"{path} is not a list of [state, loss bits]: {exc}") from None
    if sorted(results) != eval_schedule(manifest) or len(results) != len(pairs):
        raise EvaluationError(f"{path} does not hold one result per scheduled state {eval_schedule(manifest)}")
    return results


def _statement(identity: Identity, manifest: RunManifest, state: int, loss: int, claimed: int, verdict: str,
               device: str, now: int) -> EvalStatement:
    return EvalStatement.create(identity, run=manifest.run_id, state=state, loss=loss, claimed=claimed,
                                verdict=verdict, engine=manifest.engine, engine_version=manifest.engine_version,
                                device=device, issued_at=now)  # fmt: skip


def sign_results(run_dir: Path, manifest: RunManifest, identity: Identity, *, device: str,
                 now: int) -> list[EvalStatement]:
    """The publisher's ``result`` statements for its run's evaluation (one per scheduled state)."""
    if identity.public_key != manifest.publisher:
        raise EvaluationError("only the run's publisher signs its evaluation results")
    return [_statement(identity, manifest, k, bits, bits, RESULT, device, now)
            for k, bits in sorted(read_results(run_dir, manifest).items())]


def check_result(run_dir: Path, manifest: RunManifest, result: EvalStatement, identity: Identity, *, device: str,
                 now: int) -> EvalStatement:
    """Recompute the loss ``result`` publishes (checkpoint ``result.state`` of ``run_dir``, which
    must hold the manifest's checkpoint) and sign a match or mismatch of it."""
    from open1b.deterministic.evaluation import evaluate_state, loss_bits

    if result.verdict != RESULT or result.run != manifest.run_id:
        raise EvaluationError("only a result of this run is checked")
    mine = loss_bits(evaluate_state(Path(run_dir), manifest, result.state))
    verdict = MATCH if mine == result.loss else MISMATCH
    return _statement(identity, manifest, result.state, mine, result.loss, verdict, device, now)


def board(store: Store, *, policy: TrustPolicy, redundancy: int, now: int) -> tuple[BoardRow, ...]:
    """The leaderboard of every run the store holds, from its signed statements alone: an
    evaluation is certified by ``redundancy`` matching keys the policy counts."""
    runs = store.manifests()
    statements = [(store.attestations(r.run_id), store.claims(r.run_id), store.reveals(r.run_id),
                   store.evals(r.run_id)) for r in runs]
    return leaderboard(runs, [a for s in statements for a in s[0]], [e for s in statements for e in s[3]],
                       claims=[c for s in statements for c in s[1]], reveals=[r for s in statements for r in s[2]],
                       now=now, redundancy=redundancy, policy=policy, min_keys=redundancy)  # fmt: skip


def render_board(rows: list[dict]) -> str:
    """The ``leaderboard`` command's text: one line per run, ranked ones first."""
    lines = ["RANK  LOSS      STATE  EVALS c/d/u  REPLAYED  DISPUTES  DEVICES            RUN               SET"]
    for r in rows:
        e = r["evaluations"]
        loss = f"{r['loss']:.6f}" if r["loss"] is not None else "-"
        lines.append(f"{r['rank'] or '-':<5} {loss:<9} {r['eval_state'] or '-':<6} "
                     f"{e['certified']}/{e['disputed']}/{e['unchecked']:<9} {r['replayed']:>7.0%}   "
                     f"{r['disputed_steps']:<9} {','.join(r['devices']) or '-':<18} {r['run'][:16]}  "
                     f"{r['eval_set'][:8]}" + (f"  ({r['reason']})" if r["reason"] else ""))
    return "\n".join(lines)
