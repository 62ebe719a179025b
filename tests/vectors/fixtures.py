"""The statements the vector suites are built from: every field derived, nothing random."""

from __future__ import annotations

import json

from open1b.protocol import (
    Attestation, Claim, EvalStatement, ExternalRunManifest, RunManifest, SpotCheck, WitnessReveal, blake2b256,
    challenge_signature, derive_chunks, derive_slot, merkle_root, slot_signature,
)

from .common import NOW, ident
from tests.runs import attestation as signed_attestation
from tests.runs import run_manifest as signed_run_manifest
from tests.runs import witness_of

ENGINE, ENGINE_VERSION = "test-engine", "1"


def state(k: int, tag: bytes = b"vector-state") -> bytes:
    return blake2b256(tag, k.to_bytes(8, "little"))


def run_manifest(steps: int = 4, publisher: int = 0) -> RunManifest:
    return signed_run_manifest(
        ident(publisher), engine=ENGINE, engine_version=ENGINE_VERSION, model={"d_model": 8, "lr": 0.001},
        data={"corpus": "vectors"}, seed=7, steps=steps, state_hashes=[state(k) for k in range(steps + 1)],
        created_at=NOW - 3600,
    )


def spot_manifest(steps: int = 4, publisher: int = 0) -> RunManifest:
    """A run whose model map names its topology: 2 ranks × 2 micro-batches (docs/protocol.md §5.5)."""
    return signed_run_manifest(
        ident(publisher), engine=ENGINE, engine_version=ENGINE_VERSION,
        model={"d_model": 8, "lr": 0.001, "ranks": 2, "micro_batches": 2}, data={"corpus": "vectors"}, seed=7,
        steps=steps, state_hashes=[state(k) for k in range(steps + 1)], created_at=NOW - 3600,
    )  # fmt: skip


SPOT_CHUNKS = 10  # the chunk count the vectors' spot checks state


def spotcheck(signer: int, run, step: int, *, caught: str = "none", **changes) -> SpotCheck:
    """A ``spotcheck`` of ``step`` with the challenge of ``signer``'s key: by default a pass."""
    challenge = challenge_signature(ident(signer), run.run_id, step)
    slot_challenge = slot_signature(ident(signer), run.run_id, step)
    fields = dict(run=run.run_id, step=step, pre_state=run.state_hashes[step], fingerprint=state(step, b"vector-fp"),
                  challenge=challenge, slot_challenge=slot_challenge, slot=derive_slot(slot_challenge, 4),
                  chunks_total=SPOT_CHUNKS, chunks=list(derive_chunks(challenge, SPOT_CHUNKS)),
                  verdict="pass" if caught == "none" else "fail", caught=caught, engine=run.engine,
                  engine_version=run.engine_version, device="cpu/x86_64-avx2", elapsed_ms=321, issued_at=NOW)
    fields.update(changes)
    return SpotCheck.create(ident(signer), **fields)


EVAL_EVERY = 2
LOSS = 0x40200000  # 2.5 as float32 bits: the publisher's result in the vectors


def eval_manifest(steps: int = 4, publisher: int = 0, eval_set: bytes = b"vector-eval-set") -> RunManifest:
    """A run that commits to an evaluation every EVAL_EVERY states (docs/run-format.md §9.1) on the
    evaluation set named ``eval_set``."""
    return signed_run_manifest(
        ident(publisher), engine=ENGINE, engine_version=ENGINE_VERSION, model={"d_model": 8, "lr": 0.001},
        data={"corpus": "vectors", "eval_documents": 1, "eval_samples": 3, "eval_every": EVAL_EVERY,
              "eval_root": blake2b256(eval_set).hex()},
        seed=7, steps=steps, state_hashes=[state(k) for k in range(steps + 1)], created_at=NOW - 3600,
    )  # fmt: skip


def evaluation(signer: int, run, state: int, *, verdict: str = "match", loss: int = LOSS, claimed: int = LOSS,
               issued_at: int = NOW, **changes) -> EvalStatement:
    """An ``eval`` of ``state``: by default a match of the vectors' result LOSS."""
    fields = dict(run=run.run_id, state=state, loss=loss, claimed=claimed, verdict=verdict, engine=run.engine,
                  engine_version=run.engine_version, device="cpu/x86_64-avx2", issued_at=issued_at)
    fields.update(changes)
    return EvalStatement.create(ident(signer), **fields)


def attestation(signer: int, run, step: int, *, match: bool = True, issued_at: int = NOW, **changes) -> Attestation:
    fields = dict(
        run=run.run_id, step=step, pre_state=run.state_hashes[step],
        post_state=run.state_hashes[step + 1] if match else blake2b256(b"vector-wrong", bytes([step])),
        verdict="match" if match else "mismatch", engine=run.engine, engine_version=run.engine_version,
        hardware="vector-cpu", device="cpu/x86_64-avx2", elapsed_ms=1234, issued_at=issued_at,
    )
    fields.update(changes)
    return signed_attestation(ident(signer), **fields)


def claim(claimant: int, run, step: int, *, issued_at: int = NOW, lease: int = 120, slot: int = 0, **changes) -> Claim:
    fields = dict(run=run.run_id, step=step, slot=slot, issued_at=issued_at, lease_expiry=issued_at + lease)
    fields.update(changes)
    return Claim.create(ident(claimant), **fields)


def reveal(revealer: int, run, step: int, *, issued_at: int = NOW, **changes) -> WitnessReveal:
    """A reveal of the synthetic run's true witness of ``step`` (tests/runs.py) unless changed."""
    fields = dict(run=run.run_id, step=step, witness=witness_of(step), issued_at=issued_at)
    fields.update(changes)
    return WitnessReveal.create(ident(revealer), **fields)


def copied(copier: int, source: Attestation) -> Attestation:
    """``source`` re-signed by ``copier`` with every field copied, its witness binding included."""
    fields = {name: getattr(source, name) for name in Attestation.SCHEMA if name != "signer"}
    return Attestation.create(ident(copier), **fields)


def trajectory_file(first: int = 0, last: int = 12) -> bytes:
    """An Open-1B-style state_hashes.jsonl: step 0 (init) … last, with the quirks the format allows:
    CRLF line ends, a blank line, extra keys, and step 5 logged twice (a resumed run; last wins)."""
    lines = [json.dumps({"step": s, "state_hash": state(s, b"open1b-log").hex(), "loss": 2.5}) for s in range(first, last + 1)]
    lines.insert(5, json.dumps({"step": 5, "state_hash": "00" * 32}))  # superseded by the later line for step 5
    lines.insert(3, "")
    return ("\r\n".join(lines[:8]) + "\n" + "\n".join(lines[8:]) + "\n").encode()


def external_manifest(trajectory: bytes, *, first_step: int = 3, steps: int = 6, root: bytes | None = None,
                      publisher: int = 0, parse_from: bytes | None = None, **changes) -> ExternalRunManifest:
    from open1b.protocol import parse_state_hash_log

    log = parse_state_hash_log(parse_from or trajectory)
    window = [log[s] for s in range(first_step, first_step + steps + 1) if s in log]
    fields = dict(
        engine="gensyn-open-1b", engine_version="pretrain.state_hash.v3", model={"params": 1_610_000_000},
        data={"tokens": 400_000_000_000}, steps=steps, first_step=first_step, trajectory_format="jsonl",
        trajectory_uri="https://example.invalid/open-1b/logs/state_hashes.jsonl", trajectory_size=len(trajectory),
        trajectory_digest=blake2b256(trajectory), trajectory_root=root or merkle_root(window), created_at=NOW - 3600,
    )
    fields.update(changes)
    return ExternalRunManifest.create(ident(publisher), **fields)
