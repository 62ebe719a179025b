import cbor2
import pytest

from open1b.protocol import Attestation, Claim, RunManifest, codec
from open1b.protocol.errors import (
    MissingFieldError, NonCanonicalError, OversizeError, SignatureError, UnknownFieldError, WrongTypeError,
)

from .conftest import ident, make_attestation, make_claim, make_manifest
from tests.runs import run_manifest


def _resign_free_tamper(message, **changes):
    """Re-encode a message's map with changes, keeping the old signature."""
    value = cbor2.loads(message.encoded)
    value.update(changes)
    return codec.encode(value)


def test_all_messages_roundtrip(manifest):
    att = make_attestation(ident(1), manifest, 2)
    claim = make_claim(ident(2), manifest, 1)
    assert RunManifest.decode(manifest.encoded) == manifest
    assert Attestation.decode(att.encoded) == att
    assert Claim.decode(claim.encoded) == claim
    assert att.signer_peer_id == ident(1).peer_id


def test_run_id_is_digest_of_signed_bytes(manifest):
    other = make_manifest(ident(0), steps=5)
    assert manifest.run_id != other.run_id
    assert len(manifest.run_id) == 32


def test_changed_field_breaks_signature(manifest):
    att = make_attestation(ident(1), manifest, 2)
    with pytest.raises(SignatureError):
        Attestation.decode(_resign_free_tamper(att, step=3))


def test_unknown_field_is_rejected(manifest):
    att = make_attestation(ident(1), manifest, 2)
    with pytest.raises(UnknownFieldError):
        Attestation.decode(_resign_free_tamper(att, extra=1))


def test_missing_field_is_rejected(manifest):
    value = cbor2.loads(make_attestation(ident(1), manifest, 2).encoded)
    del value["hardware"]
    with pytest.raises(MissingFieldError):
        Attestation.decode(codec.encode(value))


@pytest.mark.parametrize("field,value", [("step", -1), ("step", "1"), ("step", True), ("run", b"short"),
                                          ("verdict", "maybe"), ("hardware", "x" * 200)])
def test_wrong_types_are_rejected(manifest, field, value):
    att = make_attestation(ident(1), manifest, 2)
    with pytest.raises(WrongTypeError):
        Attestation.decode(_resign_free_tamper(att, **{field: value}))


def test_kind_confusion_is_rejected(manifest):
    claim = make_claim(ident(2), manifest, 1)
    with pytest.raises((WrongTypeError, UnknownFieldError, MissingFieldError)):
        Attestation.decode(claim.encoded)


def test_non_canonical_message_is_rejected(manifest):
    att = make_attestation(ident(1), manifest, 2)
    value = cbor2.loads(att.encoded)
    shuffled = cbor2.dumps(dict(reversed(list(value.items()))))  # not canonical=True
    with pytest.raises(NonCanonicalError):
        Attestation.decode(shuffled)


def test_oversize_attestation_is_rejected(manifest):
    with pytest.raises(OversizeError):
        Attestation.decode(b"\x00" * 2000)


def test_claim_lease_must_follow_issue(manifest):
    with pytest.raises(WrongTypeError):
        make_claim(ident(2), manifest, 1, lease=0)


def test_manifest_hash_chain_must_match_steps(publisher):
    with pytest.raises(WrongTypeError):
        run_manifest(publisher, engine="e", engine_version="1", model={}, data={}, seed=0, steps=3,
                           state_hashes=[bytes(32)] * 3, created_at=0)


def test_manifest_refuses_non_finite_floats(publisher):
    with pytest.raises(WrongTypeError):
        run_manifest(publisher, engine="e", engine_version="1", model={"lr": float("nan")}, data={},
                           seed=0, steps=1, state_hashes=[bytes(32)] * 2, created_at=0)


@pytest.mark.parametrize("fmt", [1, 3, 255, "2", None])
def test_manifest_of_another_run_format_is_refused_by_number_before_its_schema(manifest, fmt):
    # Signed correctly, otherwise-valid fields: the format byte alone decides, and the error names
    # both formats. A format-1 manifest (no "format" key at all) gets the same answer.
    from open1b.protocol import RUN_FORMAT, sign

    body = dict(manifest.body())
    if fmt is None:
        del body["format"]
    else:
        body["format"] = fmt
    body["checkpoints"] = "not even a list"  # a later format may change any field: not looked at
    data = codec.encode({**body, "sig": sign(ident(0), "manifest", body)})
    with pytest.raises(WrongTypeError) as info:
        RunManifest.decode(data)
    assert info.value.code == "run_format"
    assert f"this node reads format {RUN_FORMAT}" in str(info.value) and repr(fmt) in str(info.value)
