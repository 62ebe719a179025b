import pytest

from open1b.protocol import Identity, SignatureError, peer_id_from_public_key, public_key_from_peer_id
from open1b.protocol import signing
from open1b.protocol.errors import WrongTypeError

# RFC 8032 test 1: this seed gives this public key.
RFC8032_SEED = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
RFC8032_PUB = bytes.fromhex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")


def test_seed_gives_rfc8032_public_key():
    assert Identity(RFC8032_SEED).public_key == RFC8032_PUB


def test_peer_id_roundtrip_and_prefix():
    peer_id = peer_id_from_public_key(RFC8032_PUB)
    assert peer_id.startswith("12D3KooW")
    assert public_key_from_peer_id(peer_id) == RFC8032_PUB


def test_peer_id_of_other_key_type_is_refused():
    with pytest.raises(WrongTypeError):
        public_key_from_peer_id("QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N")  # an RSA-style ID


def test_seed_must_be_32_bytes():
    with pytest.raises(WrongTypeError):
        Identity(b"short")


def test_repr_does_not_leak_the_seed():
    assert RFC8032_SEED.hex() not in repr(Identity(RFC8032_SEED))


def test_signature_is_domain_separated():
    ident = Identity(RFC8032_SEED)
    body = {"x": 1}
    sig = signing.sign(ident, "claim", body)
    signing.verify(ident.public_key, "claim", body, sig)
    with pytest.raises(SignatureError):
        signing.verify(ident.public_key, "attestation", body, sig)
    with pytest.raises(SignatureError):
        signing.verify(ident.public_key, "claim", {"x": 2}, sig)
    # a bare signature over the CBOR body (no domain) is not accepted either
    raw = ident.sign_raw(signing.encode(body))
    with pytest.raises(SignatureError):
        signing.verify(ident.public_key, "claim", body, raw)
