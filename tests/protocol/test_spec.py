"""docs/protocol.md, the code and the test vectors must say the same thing.

* every ``<!-- example: suite/case -->`` block in the spec quotes its vector file exactly;
* the CDDL of each message is the code's schema, field for field and in order;
* the constants table holds the code's constants;
* the reason codes the spec gives each validation rule are the ones the vectors expect;
* every vector suite is listed in the spec and documented in tests/vectors/README.md.
"""

import json
import re
from pathlib import Path

import pytest

from open1b.protocol import (
    PROTOCOL_VERSION, Attestation, Claim, EvalStatement, ExternalRunManifest, RunManifest, SpotCheck, WitnessReveal,
)
from open1b.protocol.schema import Bytes, Enum, ListOf, Optional, Scalars, Text, UInt

from ..mutation.reference import read_cddl
from ..vectors import ROOT as VECTORS
from ..vectors import SUITES

SPEC = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()


def _section(title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", SPEC, re.M | re.S)
    assert match, f"no section {title!r} in the spec"
    return match.group(1)


EXAMPLES = re.findall(r"<!-- example: (\S+) -->\n```text\n(.*?)```", SPEC, re.S)


def test_spec_has_examples_for_each_kind_of_commitment():
    suites = {name.split("/")[0] for name, _ in EXAMPLES}
    assert {"signing", "state_hash", "merkle", "validation", "gensyn_handoff"} <= suites


@pytest.mark.parametrize("name,block", EXAMPLES, ids=[n for n, _ in EXAMPLES])
def test_spec_example_quotes_its_vector(name, block):
    case = json.loads((VECTORS / f"{name}.json").read_text())
    for line in block.strip().splitlines():
        field, value = line.split(None, 1)
        assert str(case[field]) == value.strip(), f"{name}: {field}"


def _field_type(expr: str, aliases: dict[str, str]):
    if expr.startswith("? "):
        return Optional(_field_type(expr[2:], aliases))
    expr = aliases.get(expr, expr)
    if m := re.fullmatch(r"bstr \.size (\d+)", expr):
        return Bytes(size=int(m.group(1)))
    if m := re.fullmatch(r"uint \.le (\d+)", expr):
        return UInt(maximum=int(m.group(1)))
    if m := re.fullmatch(r"tstr \.size \(0\.\.(\d+)\)", expr):
        return Text(max_length=int(m.group(1)))
    if re.fullmatch(r'"\w+"( / "\w+")*', expr):
        return Enum(frozenset(re.findall(r'"(\w+)"', expr)))
    if m := re.fullmatch(r"\[0\*(\d+) (\w+)\]", expr):
        return ListOf(_field_type(m.group(2), aliases), max_length=int(m.group(1)))
    if m := re.fullmatch(r"\{ 0\*(\d+) scalar-key => scalar \}", expr):
        assert aliases["scalar-key"] == f"tstr .size (0..{Scalars(0).max_text})"
        return Scalars(max_entries=int(m.group(1)))
    raise AssertionError(f"the test does not know the CDDL type {expr!r}")


@pytest.mark.parametrize("cls", [RunManifest, ExternalRunManifest, Claim, Attestation, WitnessReveal, EvalStatement,
                                 SpotCheck],
                         ids=lambda c: c.KIND)
def test_cddl_is_the_code_schema(cls):
    aliases, messages = read_cddl()
    fields = messages[cls.KIND]
    assert fields[0] == ("kind", f'"{cls.KIND}"') and fields[1] == ("v", str(PROTOCOL_VERSION))
    assert fields[-1] == ("sig", "signature") and _field_type("signature", aliases) == Bytes(size=64)
    body = fields[2:-1]
    assert [name for name, _ in body] == list(cls.SCHEMA), "fields or their order differ"
    for name, expr in body:
        assert _field_type(expr, aliases) == cls.SCHEMA[name], name
    assert f'"{cls.SIGNER}": pubkey,' in re.search(rf"{cls.KIND} = \{{(.*?)\n\}}", SPEC, re.S).group(1)


def test_constants_table_is_the_code():
    from open1b.node import blobs, p2p, spot_answers, sync
    from open1b.protocol import claims, codec, evaluation, messages, spotcheck, trajectory, validation, witness
    from open1b.protocol.dispute import bisection

    code = {
        "PROTOCOL_VERSION": messages.PROTOCOL_VERSION, "MAX_MANIFEST_SIZE": messages.MAX_MANIFEST_SIZE,
        "MAX_CLAIM_SIZE": messages.MAX_CLAIM_SIZE, "MAX_ATTESTATION_SIZE": messages.MAX_ATTESTATION_SIZE,
        "MAX_REVEAL_SIZE": witness.MAX_REVEAL_SIZE, "MAX_EVAL_SIZE": evaluation.MAX_EVAL_SIZE,
        "MAX_DEPTH": codec.MAX_DEPTH, "MAX_INLINE_STEPS": messages.MAX_INLINE_STEPS,
        "MAX_EXTERNAL_STEPS": trajectory.MAX_EXTERNAL_STEPS, "MAX_TRAJECTORY_SIZE": trajectory.MAX_TRAJECTORY_SIZE,
        "MAX_CLOCK_SKEW_SECONDS": validation.MAX_CLOCK_SKEW_SECONDS, "LEASE_ROUND_SECONDS": claims.LEASE_ROUND_SECONDS,
        "MAX_LEASE_SECONDS": claims.MAX_LEASE_SECONDS, "MAX_SYNC_REQUEST": sync.MAX_SYNC_REQUEST,
        "MAX_SYNC_STATEMENTS": sync.MAX_SYNC_STATEMENTS, "MAX_SYNC_RUNS": sync.MAX_SYNC_RUNS,
        "MAX_SYNC_WANT": sync.MAX_SYNC_WANT, "MAX_BLOB_CHUNK": blobs.MAX_CHUNK,
        "MAX_BLOB_REQUEST": blobs.MAX_REQUEST, "MAX_BLOB_SIZE": blobs.MAX_BLOB_SIZE,
        "MAX_GOSSIP_MESSAGE": p2p.MAX_PUBSUB_MESSAGE, "MAX_SPOTCHECK_SIZE": spotcheck.MAX_SPOTCHECK_SIZE,
        "CHALLENGE_CHUNKS": spotcheck.CHALLENGE_CHUNKS, "ANSWER_SECONDS": spotcheck.ANSWER_SECONDS,
        "MAX_CHALLENGE_REQUEST": spot_answers.MAX_CHALLENGE_REQUEST,
        "MAX_PENDING_ANSWERS": spot_answers.MAX_PENDING_ANSWERS,
        "MAX_ANSWER_SIZE": spotcheck.MAX_ANSWER_SIZE,
        "ROUND_TIMEOUT_S": bisection.ROUND_TIMEOUT_S, "ROUND_PACE_S": bisection.ROUND_PACE_S,
        "TRACE_TIMEOUT_S": bisection.TRACE_TIMEOUT_S, "CHUNK_ROUNDS": bisection.CHUNK_ROUNDS,
    }
    table = dict(re.findall(r"^\| `(\w+)` \| (\d+) \|", _section("2. Constants"), re.M))
    assert {k: int(v) for k, v in table.items()} == code


def test_validation_reason_codes_agree_with_the_vectors():
    rules = _section("7. Validation")
    in_spec = set()
    for outcome, text in re.findall(r"^- `\[(REJECT|IGNORE)\]` (.*?)(?=\n- |\n\n)", rules, re.S | re.M):
        codes = re.findall(r"`(\w+)`", text.split(" — ", 1)[1]) if " — " in text else []
        assert codes, f"rule without a reason code: {text!r}"
        in_spec |= {(outcome.lower(), c) for c in codes}
    in_spec |= {("reject", c) for c in re.findall(r"`(\w+)`", _section("5. Signed messages")) if c in {
        "oversize", "malformed", "non_canonical", "kind", "version", "unknown_field", "missing_field", "wrong_type",
        "bad_signature", "run_format", "state_hashes", "checkpoints", "witnesses", "samples", "lease_order",
        "device"}}
    in_vectors = {(c["outcome"], c["reason"]) for c in
                  (json.loads(p.read_text()) for p in (VECTORS / "validation").glob("*.json")) if c["outcome"] != "accept"}
    assert in_vectors <= in_spec, in_vectors - in_spec
    untested = {code for _, code in in_spec} - {code for _, code in in_vectors}
    assert untested == {"claim_key"}  # DHT record keys: the claims suite covers them


def test_every_vector_suite_is_specified_and_documented():
    listed = set(re.findall(r"^\| `(\w+)` \|", _section("15. Test vectors and examples"), re.M))
    assert listed == set(SUITES)
    readme = (VECTORS / "README.md").read_text()
    assert set(re.findall(r"^### `(\w+)`", readme, re.M)) == set(SUITES)


def test_referee_reason_codes_agree_with_the_dispute_vectors():
    """Every code a `dispute` vector gives is one §18.4 names, and every rule of §18.4's own (after
    the decoding rules of §3.2 and §5.2) has a vector or a unit test."""
    rules = re.search(r"^### 18\.4 The referee\n(.*?)(?=^### )", SPEC, re.M | re.S).group(1)
    named = set(re.findall(r"`(\w+)`", rules))
    own = {"traces_differ", "same_trace", "record_path", "inputs_differ", "unsupported_op", "op_schema",
           "output_shape", "output", "claimed_chunk", "reads", "state_input", "bad_input", "guilty"}
    assert own <= named, own - named
    in_vectors = {json.loads(p.read_text())["code"] for p in (VECTORS / "dispute").glob("*.json")}
    assert in_vectors <= named
    assert own - in_vectors == {"op_schema", "bad_input"}  # tests/protocol/test_dispute_proof.py has them
