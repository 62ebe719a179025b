"""The devnet's part in certified evaluation (docs/run-format.md §9): the trainer's signed results
(one of them false, on request), and the leaderboard the observer's statements imply, computed
here by the protocol library alone, to compare with the board the observer serves."""

from __future__ import annotations

import time
from pathlib import Path

from open1b.deterministic.device import cpu_device_class
from open1b.node.client import call
from open1b.node.evaluations import sign_results
from open1b.protocol import (
    Attestation,
    EvalStatement,
    Identity,
    RunManifest,
    TrustPolicy,
    leaderboard,
    public_key_from_peer_id,
)


def trainer_results(run_dir: Path, manifest: RunManifest, trainer: Identity, tamper: int | None) -> list[EvalStatement]:
    """The trainer's signed results; with ``tamper``, that state's loss has its lowest bit flipped."""
    results = sign_results(run_dir, manifest, trainer, device=cpu_device_class(), now=int(time.time()))
    return [r if r.state != tamper else EvalStatement.create(
        trainer, **{**{f: getattr(r, f) for f in EvalStatement.SCHEMA if f != "signer"},
                    "loss": r.loss ^ 1, "claimed": r.loss ^ 1}) for r in results]


def implied_board(api: str, manifest: RunManifest, redundancy: int) -> list[dict]:
    """The leaderboard of the observer's signed statements (its attestations and evals, fetched
    raw) under its own trust policy: what the board it serves must equal."""
    run = manifest.run_id.hex()
    atts = [Attestation.decode(bytes.fromhex(a["encoded"])) for a in call(api, f"/v1/attestations/{run}")]
    evals = [EvalStatement.decode(bytes.fromhex(e)) for e in call(api, f"/v1/evals/{run}")]
    p = call(api, f"/v1/coverage/{run}")["policy"]
    policy = TrustPolicy(p["name"], frozenset(public_key_from_peer_id(r) for r in p["roots"]), p["quorum"])
    rows = leaderboard([manifest], atts, evals, now=int(time.time()), redundancy=redundancy, policy=policy,
                       min_keys=redundancy)
    return [r.to_json() for r in rows]


def render_evaluations(summary: dict) -> list[str]:
    if not summary["evaluations"]:
        return []
    lines = ["", "state  evaluation  loss bits  checked by"]
    for e in summary["evaluations"]:
        bits = e["loss_bits"] if e["loss_bits"] is not None else "-"
        line = f"{e['state']:>5}  {e['status']:<10}  {bits!s:>9}  {', '.join(p[-8:] for p in e['checkers']) or '-'}"
        if e["dissenters"]:
            line += "  mismatch: " + ", ".join(p[-8:] for p in e["dissenters"])
        lines.append(line)
    same = "equal to" if summary["leaderboard_is_the_statements"] else "DIFFERENT FROM"
    lines.append(f"leaderboard (observer): {len(summary['leaderboard'])} row(s), {same} the board its statements imply")
    return lines
