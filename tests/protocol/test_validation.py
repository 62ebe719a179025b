import cbor2

from open1b.protocol import Outcome, codec, validate_attestation, validate_claim, validate_manifest
from open1b.protocol.validation import MAX_CLOCK_SKEW_SECONDS

from .conftest import NOW, ident, make_attestation, make_claim, make_manifest
from tests.runs import attestation


def lookup(manifest):
    return {manifest.run_id: manifest}.get


def test_valid_attestations_are_accepted(manifest):
    for match in (True, False):
        verdict = validate_attestation(make_attestation(ident(1), manifest, 1, match=match).encoded,
                                       lookup(manifest), NOW)
        assert verdict.outcome is Outcome.ACCEPT and verdict.message.step == 1


def test_unknown_run_is_ignored(manifest):
    att = make_attestation(ident(1), manifest, 1)
    assert validate_attestation(att.encoded, {}.get, NOW).outcome is Outcome.IGNORE


def test_future_statement_is_ignored(manifest):
    att = make_attestation(ident(1), manifest, 1, issued_at=NOW + MAX_CLOCK_SKEW_SECONDS + 1)
    assert validate_attestation(att.encoded, lookup(manifest), NOW).outcome is Outcome.IGNORE
    ok = make_attestation(ident(1), manifest, 1, issued_at=NOW + MAX_CLOCK_SKEW_SECONDS)
    assert validate_attestation(ok.encoded, lookup(manifest), NOW).outcome is Outcome.ACCEPT


def _signed_variant(manifest, **changes):
    base = make_attestation(ident(1), manifest, 1)
    fields = {k: v for k, v in base.body().items() if k not in ("kind", "v", "signer")}
    fields.update(changes)
    return attestation(ident(1), **fields)


def test_self_contradicting_verdict_is_rejected(manifest):
    lying = _signed_variant(manifest, verdict="match", post_state=b"\x07" * 32)
    verdict = validate_attestation(lying.encoded, lookup(manifest), NOW)
    assert verdict.outcome is Outcome.REJECT and "verdict" in verdict.reason


def test_wrong_pre_state_is_rejected(manifest):
    bad = _signed_variant(manifest, pre_state=manifest.state_hashes[0])
    assert validate_attestation(bad.encoded, lookup(manifest), NOW).outcome is Outcome.REJECT


def test_step_outside_run_is_rejected(manifest):
    bad = _signed_variant(manifest, step=manifest.steps)
    assert validate_attestation(bad.encoded, lookup(manifest), NOW).outcome is Outcome.REJECT


def test_other_engine_is_rejected(manifest):
    bad = _signed_variant(manifest, engine="another")
    assert validate_attestation(bad.encoded, lookup(manifest), NOW).outcome is Outcome.REJECT


def test_garbage_and_bad_signature_are_rejected(manifest):
    att = make_attestation(ident(1), manifest, 1)
    value = cbor2.loads(att.encoded)
    value["sig"] = bytes(64)
    for data in (b"\x00garbage", att.encoded[:-3], codec.encode(value)):
        assert validate_attestation(data, lookup(manifest), NOW).outcome is Outcome.REJECT


def test_claims_validate(manifest):
    good = make_claim(ident(2), manifest, 1)
    assert validate_claim(good.encoded, lookup(manifest), NOW).outcome is Outcome.ACCEPT
    too_long = make_claim(ident(2), manifest, 1, lease=10_000)
    assert validate_claim(too_long.encoded, lookup(manifest), NOW).outcome is Outcome.REJECT
    outside = make_claim(ident(2), manifest, manifest.steps)
    assert validate_claim(outside.encoded, lookup(manifest), NOW).outcome is Outcome.REJECT
    assert validate_claim(good.encoded, {}.get, NOW).outcome is Outcome.IGNORE


def test_manifest_validates(manifest):
    assert validate_manifest(manifest.encoded, NOW).accepted
    assert validate_manifest(manifest.encoded[:-1], NOW).outcome is Outcome.REJECT
    future = make_manifest(ident(0))
    assert validate_manifest(future.encoded, NOW - MAX_CLOCK_SKEW_SECONDS - 1).outcome is Outcome.IGNORE
