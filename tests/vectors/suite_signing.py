"""Suite ``signing``: Ed25519 identities, peer IDs, and the signed messages of every kind.

Key case: ``{"description", "seed", "public_key", "peer_id"}``.
Message case: ``{"description", "seed", "peer_id", "kind", "body", "signing_bytes", "signature",
"encoded", "digest"}``: ``body`` is the typed-JSON map without ``sig``; ``signing_bytes`` =
"open1b/v2/sig\\0" ‖ kind ‖ 0x00 ‖ canonical(body); ``signature`` is Ed25519 over it;
``encoded`` = canonical(body + {"sig"}); ``digest`` = B2(encoded), the message's identity.
Verification case ``ed25519-*``: ``{"description", "public_key", "message", "signature", "valid"}``:
whether the strict verification of docs/protocol.md §5.4 accepts ``signature`` by ``public_key``
over ``message``.
"""

from __future__ import annotations

from pathlib import Path

from open1b.protocol import (
    Identity, SignatureError, decode_message, encode, peer_id_from_public_key, public_key_from_peer_id, sign,
    signing_bytes,
)
from open1b.protocol.identity import verify_raw

from . import ed25519_forgery as forgery
from . import fixtures
from .common import hx, seed, typed, unhex, untyped

NAME = "signing"


def _message_case(description: str, signer: int, message) -> dict:
    body = message.body()
    return {
        "description": description, "seed": hx(seed(signer)), "peer_id": Identity(seed(signer)).peer_id,
        "kind": message.KIND, "body": typed(body), "signing_bytes": hx(signing_bytes(message.KIND, body)),
        "signature": hx(message.sig), "encoded": hx(message.encoded), "digest": hx(message.digest),
    }


def cases() -> dict[str, dict]:
    out = {}
    for n in (0, 1, 2):
        ident = Identity(seed(n))
        out[f"key-{n}"] = {"description": f"identity from seed {n}", "seed": hx(seed(n)),
                           "public_key": hx(ident.public_key), "peer_id": ident.peer_id}
    manifest = fixtures.run_manifest(steps=2)
    out["manifest"] = _message_case("a run manifest with 2 steps (3 state hashes)", 0, manifest)
    out["attestation"] = _message_case("a match attestation of step 1", 1, fixtures.attestation(1, manifest, 1))
    out["claim"] = _message_case("a claim on slot 0 of step 0", 2, fixtures.claim(2, manifest, 0))
    out["reveal"] = _message_case("a reveal of step 1's replay witness", 3, fixtures.reveal(3, manifest, 1))
    out["eval"] = _message_case("a match of the evaluation loss of state 2", 1,
                                fixtures.evaluation(1, fixtures.eval_manifest(), 2))
    traj = fixtures.trajectory_file()
    out["external-manifest"] = _message_case("an external manifest over a 6-step window of a jsonl log", 0,
                                             fixtures.external_manifest(traj))
    out.update(_verification_cases())
    return out


def _verification_cases() -> dict[str, dict]:
    """Strict Ed25519 (§5.4), each case described by the rule that decides it: most rejected cases
    satisfy the plain equation (rules 1-4 reject them), ``mixed-order-key`` only the cofactored one."""
    message = b"open1b/test-vector/ed25519"
    key, good = Identity(seed(1)).public_key, Identity(seed(1)).sign_raw(message)
    cases = {
        "valid": ("a good signature", key, message, good),
        "wrong-message": ("a good signature over another message", key, message + b"!", good),
        "s-plus-l": ("rule 1: a good signature with L added to S (S >= L)", key, message, forgery.s_plus_l(good)),
        "r-small-order": ("rule 4: R is the identity, and [S]B - [k]A = R holds", key, message,
                          forgery.sign_with_small_order_r(seed(1), key, message)),
        "r-non-canonical": ("rule 4: R spells the identity non-canonically (y = p + 1), which rule 4's list names; "
                            "[S]B - [k]A is that point", key, message,
                            forgery.sign_with_small_order_r(seed(1), key, message, forgery.point(forgery.P + 1))),
        "r-non-canonical-large-order": ("rule 5: R's y is p + 3, a non-canonical spelling of a curve point of large "
                                        "order that no list names; the encoding of [S]B - [k]A is canonical, so it "
                                        "never equals these bytes", key, message,
                                        forgery.point(forgery.NON_CANONICAL_Y) + good[32:]),
        "key-non-canonical-large-order": ("rule 2: the key's y is p + 3, a non-canonical spelling of a curve point of "
                                          "large order that rule 3's list does not name", forgery.point(
                                              forgery.NON_CANONICAL_Y), message, good),
    }
    mixed = forgery.mixed_order_key(seed(1))
    for name, divides, description in (
            ("mixed-order-key", False, "rule 5: a key of mixed order ([a]B + T, T of order 8) and k not a multiple of "
                                       "8: only the cofactored equation holds, so a ZIP-215 verifier with rules 1-4 "
                                       "accepts it and a strict one must not"),
            ("mixed-order-key-k-multiple-of-8", True, "a key of mixed order is not of small order: with 8 dividing "
                                                      "k, [k]T vanishes and the plain equation holds, so it verifies")):
        data, signature = forgery.sign_as_mixed_order_key(seed(1), lambda i: message + b"/%d" % i, divides)
        cases[name] = (description, mixed, data, signature)
    for name, small in forgery.SMALL_ORDER_KEYS.items():
        rule = "2" if name.endswith("non-canonical") else "3"
        cases[f"key-{name}"] = (f"rule {rule}: a key of small order ({name}); [k]A is the identity, so [S]B = R holds",
                                small, message, forgery.sign_as_small_order_key(small, message))
    return {f"ed25519-{name}": {"description": description, "public_key": hx(public_key), "message": hx(data),
                                "signature": hx(signature), "valid": _verifies(public_key, data, signature)}
            for name, (description, public_key, data, signature) in cases.items()}


def _verifies(public_key: bytes, message: bytes, signature: bytes) -> bool:
    try:
        verify_raw(public_key, message, signature)
    except SignatureError:
        return False
    return True


def check(case: dict, root: Path) -> None:
    if "valid" in case:
        assert _verifies(unhex(case["public_key"]), unhex(case["message"]), unhex(case["signature"])) == case["valid"]
        return
    ident = Identity(unhex(case["seed"]))
    assert ident.peer_id == case["peer_id"]
    if "public_key" in case:
        key = unhex(case["public_key"])
        assert ident.public_key == key
        assert peer_id_from_public_key(key) == case["peer_id"] and public_key_from_peer_id(case["peer_id"]) == key
        return
    body = untyped(case["body"])
    assert signing_bytes(case["kind"], body) == unhex(case["signing_bytes"])
    assert sign(ident, case["kind"], body) == unhex(case["signature"])  # Ed25519 is deterministic
    assert encode({**body, "sig": unhex(case["signature"])}) == unhex(case["encoded"])
    message = decode_message(unhex(case["encoded"]))  # verifies the signature
    assert message.KIND == case["kind"] and message.digest == unhex(case["digest"])
    assert message.signer_peer_id == case["peer_id"]
