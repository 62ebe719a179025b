"""External trajectories: the jsonl rules, resolution against the manifest, and runs resolved
from them judged and counted exactly like inline runs."""

import json

import pytest

from open1b.protocol import (
    ExternalRunManifest, InvalidStatementError, Outcome, StepStatus, blake2b256, coverage, decode_message,
    merkle_proof, merkle_root, parse_state_hash_log, resolve_external_run, validate_attestation, validate_manifest, WrongTypeError,
)
from open1b.protocol.trajectory import MAX_TRAJECTORY_SIZE

from .conftest import NOW, ident, make_attestation, make_claim

H = [blake2b256(b"log", bytes([s])) for s in range(20)]


def log(*rows, end="\n") -> bytes:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + end for r in rows).encode()


def row(step, value=None, **extra):
    return {"step": step, "state_hash": (value or H[step]).hex(), **extra}


def manifest_for(data: bytes, first: int, steps: int, **changes) -> ExternalRunManifest:
    fields = dict(engine="gensyn-open-1b", engine_version="pretrain.state_hash.v3", model={}, data={}, steps=steps,
                  first_step=first, trajectory_format="jsonl", trajectory_uri="", trajectory_size=len(data),
                  trajectory_digest=blake2b256(data), trajectory_root=merkle_root(H[first:first + steps + 1]),
                  created_at=NOW)
    fields.update(changes)
    return ExternalRunManifest.create(ident(0), **fields)


def test_jsonl_rules():
    data = log(row(0), "", "   ", row(1, extra="x"), row(2, blake2b256(b"old")), row(2), end="\r\n")
    assert parse_state_hash_log(data) == {0: H[0], 1: H[1], 2: H[2]}  # CRLF, blanks, extra keys, last wins
    upper = log({"step": 3, "state_hash": H[3].hex().upper()})
    assert parse_state_hash_log(upper) == {3: H[3]}


@pytest.mark.parametrize("line", [
    '{"step": 1}',                                              # no state_hash
    '{"step": -1, "state_hash": "%s"}' % H[1].hex(),           # negative step
    '{"step": 1.0, "state_hash": "%s"}' % H[1].hex(),          # a float step
    '{"step": true, "state_hash": "%s"}' % H[1].hex(),         # a bool step
    '{"step": 1, "state_hash": "%s"}' % H[1].hex()[:62],       # 31 bytes
    '{"step": 1, "state_hash": "%s"}' % ("ab " * 21 + "a"),    # 64 characters, not 64 hex digits
    '{"step": 1, "step": 2, "state_hash": "%s"}' % H[1].hex(), # duplicate key
    '{"step": 1, "state_hash": "%s", "loss": NaN}' % H[1].hex(),  # not JSON
    '[1, "%s"]' % H[1].hex(),                                  # not an object
    '{"step": 1, "state_hash": "%s"' % H[1].hex(),             # truncated
])
def test_malformed_lines_are_rejected(line):
    with pytest.raises(InvalidStatementError) as info:
        parse_state_hash_log(log(row(0), line))
    assert info.value.code == "trajectory_format" and "line 2" in str(info.value)


def test_non_utf8_is_rejected():
    with pytest.raises(InvalidStatementError, match="UTF-8"):
        parse_state_hash_log(b'{"step": 0, "state_hash": "\xff"}\n')


def test_resolution_checks_every_commitment():
    data = log(*(row(s) for s in range(10)))
    run = resolve_external_run(manifest_for(data, 2, 5), data)
    assert run.state_hashes == tuple(H[2:8]) and run.steps == 5
    for changes, code in [({"trajectory_size": len(data) + 1}, "trajectory_digest"),
                          ({"trajectory_digest": blake2b256(b"x")}, "trajectory_digest"),
                          ({"first_step": 5}, "trajectory_window"),
                          ({"trajectory_root": merkle_root(H[3:8])}, "trajectory_root")]:
        with pytest.raises(InvalidStatementError) as info:
            resolve_external_run(manifest_for(data, 2, 5, **changes), data)
        assert info.value.code == code, changes


def test_a_light_verifier_checks_one_hash_by_proof():
    data = log(*(row(s) for s in range(10)))
    m = manifest_for(data, 2, 5)
    window = H[2:8]
    for j, h in enumerate(window):
        assert m.proves(j, h, merkle_proof(window, j))
        assert not m.proves(j, H[0], merkle_proof(window, j))


def test_external_runs_are_judged_and_counted_like_inline_runs():
    data = log(*(row(s) for s in range(10)))
    m = manifest_for(data, 4, 3)
    assert validate_manifest(m.encoded, NOW).accepted and decode_message(m.encoded) == m
    run = resolve_external_run(m, data)
    known = {run.run_id: run}.get
    good = make_attestation(ident(1), run, 1)  # log step 5 -> 6
    assert good.pre_state == H[5] and good.post_state == H[6]
    assert validate_attestation(good.encoded, known, NOW).accepted
    wrong = make_attestation(ident(1), run, 1, match=False)
    assert validate_attestation(wrong.encoded, known, NOW).accepted  # a mismatch is a valid statement
    unresolved = validate_attestation(good.encoded, {}.get, NOW)
    assert (unresolved.outcome, unresolved.code) == (Outcome.IGNORE, "unknown_run")
    cov = coverage(run, [good, wrong, make_attestation(ident(2), run, 0)], [make_claim(ident(3), run, 2)], now=NOW)
    assert [s.status for s in cov.steps] == [StepStatus.VERIFIED, StepStatus.DISPUTED, StepStatus.CLAIMED]


def test_external_manifest_limits():
    data = log(row(0), row(1))
    with pytest.raises(WrongTypeError) as info:
        manifest_for(data, 0, 1, trajectory_size=MAX_TRAJECTORY_SIZE + 1)
    assert info.value.code == "wrong_type"
    with pytest.raises(WrongTypeError) as info:
        manifest_for(data, 0, 0)
    assert info.value.code == "state_hashes"
