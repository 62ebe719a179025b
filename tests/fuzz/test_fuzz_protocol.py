"""Fuzzing every decoder and validator of the protocol library: whatever the bytes, the answer is
a value or a *typed* ProtocolError whose reason code the spec names; an accepted statement is
exactly the bytes given, authenticated and consistent with its run."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from open1b.protocol import (
    Attestation, Claim, EvalStatement, ExternalRunManifest, Outcome, ProtocolError, RunManifest, WitnessReveal,
    claim_key, decode, decode_message, encode, parse_state_hash_log, resolve_external_run, select_claim_record,
    validate_attestation, validate_claim, validate_claim_record, validate_eval, validate_manifest, validate_reveal,
)
from open1b.protocol.claims import claim_precedence
from open1b.protocol.gensyn_handoff import HandoffMeta, read_safetensors
from open1b.protocol.validation import check_attestation, check_claim, check_reveal

from ..vectors import fixtures
from ..vectors.common import NOW
from .budget import FUZZ
from .strategies import SPEC_CODES, inputs_for, mutated, raw_cbor, values

RUN = fixtures.run_manifest()
TRAJECTORY = fixtures.trajectory_file()
EXTERNAL = fixtures.external_manifest(TRAJECTORY)
RUNS = {RUN.run_id: RUN}
ATTESTATION = fixtures.attestation(1, RUN, 1)
CLAIM = fixtures.claim(1, RUN, 1)
REVEAL = fixtures.reveal(1, RUN, 1)
EVAL_RUN = fixtures.eval_manifest()
EVAL = fixtures.evaluation(1, EVAL_RUN, 2)


def _typed(exc: ProtocolError) -> None:
    assert exc.code in SPEC_CODES, f"reason code {exc.code!r} is not in docs/protocol.md"
    assert exc.outcome in (Outcome.REJECT, Outcome.IGNORE)


@pytest.mark.parametrize("cls,message,signer", [
    (Attestation, ATTESTATION, 1), (Claim, CLAIM, 1), (RunManifest, RUN, 0), (ExternalRunManifest, EXTERNAL, 0),
    (WitnessReveal, REVEAL, 1), (EvalStatement, EVAL, 1),
], ids=lambda v: getattr(v, "KIND", None) or getattr(v, "__name__", "") if isinstance(v, type) else None)
@FUZZ
@given(data=st.data())
def test_message_decoders_give_the_bytes_back_or_a_typed_error(cls, message, signer, data):
    raw = data.draw(inputs_for(message, signer))
    for decoder in (cls.decode, decode_message):
        try:
            got = decoder(raw)
        except ProtocolError as exc:
            _typed(exc)
            continue
        assert got.encoded == raw and type(got).decode(raw) == got  # canonical, authenticated, stable


@FUZZ
@given(raw=inputs_for(EVAL, 1), now=st.sampled_from([NOW, NOW - 10**6, 0]))
def test_eval_validator(raw, now):
    verdict = validate_eval(raw, {EVAL_RUN.run_id: EVAL_RUN}.get, now)
    if verdict.accepted:
        assert verdict.message.encoded == raw and verdict.message.run == EVAL_RUN.run_id
    else:
        assert verdict.code in SPEC_CODES, verdict.code


@FUZZ
@given(st.one_of(st.binary(max_size=512), raw_cbor(), mutated(encode({"a": [1, 2.5, b"x", None]}))))
def test_cbor_decoder_round_trips_or_gives_a_typed_error(raw):
    try:
        value = decode(raw, max_size=512)
    except ProtocolError as exc:
        assert exc.code in {"oversize", "malformed", "non_canonical"}
        return
    assert encode(value) == raw


@FUZZ
@given(raw=inputs_for(ATTESTATION, 1), now=st.sampled_from([NOW, NOW - 10**6, 0]))
def test_attestation_validator(raw, now):
    verdict = validate_attestation(raw, RUNS.get, now)
    if verdict.accepted:
        att = verdict.message
        assert att.encoded == raw and Attestation.decode(raw) == att
        check_attestation(att, RUN)  # consistent with the run it names
        assert att.issued_at <= now + 120
    else:
        assert verdict.code in SPEC_CODES and verdict.message is None
        if verdict.outcome is Outcome.IGNORE:
            assert verdict.code in {"unknown_run", "future"}


@FUZZ
@given(raw=inputs_for(CLAIM, 1))
def test_claim_validator(raw):
    verdict = validate_claim(raw, RUNS.get, NOW)
    if verdict.accepted:
        assert verdict.message.encoded == raw
        check_claim(verdict.message, RUN)
    else:
        assert verdict.code in SPEC_CODES and verdict.message is None


@FUZZ
@given(raw=inputs_for(REVEAL, 1))
def test_reveal_validator(raw):
    verdict = validate_reveal(raw, RUNS.get, NOW)
    if verdict.accepted:
        assert verdict.message.encoded == raw
        check_reveal(verdict.message, RUN)  # its witness opens the run's commitment
    else:
        assert verdict.code in SPEC_CODES and verdict.message is None


@FUZZ
@given(raw=st.one_of(inputs_for(RUN, 0), inputs_for(EXTERNAL, 0)))
def test_manifest_validator(raw):
    verdict = validate_manifest(raw, NOW)
    assert verdict.accepted == (verdict.message is not None)
    if verdict.accepted:
        assert verdict.message.encoded == raw
    else:
        assert verdict.code in SPEC_CODES


@FUZZ
@given(st.lists(st.one_of(inputs_for(CLAIM, 1), inputs_for(fixtures.claim(2, RUN, 1, issued_at=NOW + 5), 2)),
                min_size=1, max_size=6), st.randoms(use_true_random=False))
def test_claim_records_never_let_an_invalid_record_win_and_ignore_arrival_order(records, rng):
    key = claim_key(RUN.run_id, 1, 0)
    valid = []
    for record in records:
        try:
            valid.append(validate_claim_record(key, record))
        except ProtocolError as exc:
            _typed(exc)
    winner = select_claim_record(key, records)
    assert (winner is None) == (not valid)
    if winner is not None:
        best = min(valid, key=claim_precedence)
        assert records[winner] == best.encoded
        shuffled = list(records)
        rng.shuffle(shuffled)
        assert shuffled[select_claim_record(key, shuffled)] == best.encoded


def _jsonl_lines():
    good = st.builds(lambda s, h: json.dumps({"step": s, "state_hash": h}), st.integers(0, 20),
                     st.text("0123456789abcdefABCDEF", min_size=64, max_size=64))
    odd = st.one_of(st.text(max_size=60), values.map(lambda v: json.dumps(v, default=repr)),
                    st.integers(1, 3000).map(lambda n: "[" * n))
    return st.lists(st.one_of(good, odd), max_size=12).map(lambda ls: "\n".join(ls).encode())


@FUZZ
@given(st.one_of(_jsonl_lines(), st.binary(max_size=400), mutated(TRAJECTORY)))
def test_trajectory_parsing_and_resolution(raw):
    try:
        log = parse_state_hash_log(raw)
    except ProtocolError as exc:
        _typed(exc)
    else:
        assert all(type(k) is int and k >= 0 and len(v) == 32 for k, v in log.items())
    try:
        run = resolve_external_run(EXTERNAL, raw)
    except ProtocolError as exc:
        _typed(exc)
    else:
        assert raw == TRAJECTORY and run.run_id == EXTERNAL.run_id


def _safetensors(header: object, data: bytes = b"") -> bytes:
    text = json.dumps(header, default=repr).encode()
    return struct.pack("<Q", len(text)) + text + data


VALID_ST = _safetensors({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, bytes(8))


@FUZZ
@given(st.one_of(st.binary(max_size=300), mutated(VALID_ST), values.map(_safetensors),
                 st.integers(1, 3000).map(lambda n: _safetensors(None)[:8] + b"[" * n)))
def test_safetensors_headers_and_handoff_meta(raw):
    # Hand-off files are read from disk, not from peers: typed errors with the module's own code.
    try:
        tensors = read_safetensors(raw)
    except ProtocolError as exc:
        assert exc.code == "handoff"
    else:
        assert all(isinstance(name, str) for name in tensors)
    try:
        HandoffMeta.from_json(json.loads(raw[8:].decode("utf-8", "replace")))
    except (ValueError, RecursionError):
        pass  # not JSON at all: the caller's json.loads fails first
    except ProtocolError as exc:
        assert exc.code == "handoff"


_JSON = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-2, 2**64), st.text(max_size=70),
                               st.sampled_from(["00" * 32, "ff" * 32, "zz"])),
                     lambda inner: st.one_of(st.lists(inner, max_size=4),
                                             st.dictionaries(st.sampled_from(
                                                 ["kind", "entry", "index", "start", "end", "path", "samples", "tokens",
                                                  "draws", "lower", "upper", "digest"]), inner, max_size=6)),
                     max_leaves=30)


@FUZZ
@given(value=st.one_of(_JSON, st.fixed_dictionaries({"kind": st.sampled_from(["included", "never_drawn", "absent"])},
                                                   optional={"entry": _JSON, "samples": _JSON, "draws": _JSON,
                                                             "lower": _JSON, "upper": _JSON})),
       document=st.binary(max_size=40))
def test_data_proofs_from_json_are_proofs_or_value_errors_and_never_hold_by_accident(value, document):
    """A proof read from untrusted JSON is a proof or a ValueError; checking it never raises, and
    random fields never prove anything about a run (docs/run-format.md §8.5)."""
    from open1b.protocol.data_proofs import proof_from_json, verify_data_proof

    from ..vectors.suite_data import _corpus

    try:
        proof = proof_from_json(value)
    except ValueError:
        return
    assert not verify_data_proof(_corpus()[3], document, proof).holds
