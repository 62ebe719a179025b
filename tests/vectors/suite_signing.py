"""Suite ``signing``: Ed25519 identities, peer IDs, and the signed messages of every kind.

Key case: ``{"description", "seed", "public_key", "peer_id"}``.
Message case: ``{"description", "seed", "peer_id", "kind", "body", "signing_bytes", "signature",
"encoded", "digest"}``: ``body`` is the typed-JSON map without ``sig``; ``signing_bytes`` =
"open1b/v1/sig\\0" ‖ kind ‖ 0x00 ‖ canonical(body); ``signature`` is Ed25519 over it;
``encoded`` = canonical(body + {"sig"}); ``digest`` = B2(encoded), the message's identity.
"""

from __future__ import annotations

from pathlib import Path

from open1b.protocol import (
    Identity, decode_message, encode, peer_id_from_public_key, public_key_from_peer_id, sign, signing_bytes,
)

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
    traj = fixtures.trajectory_file()
    out["external-manifest"] = _message_case("an external manifest over a 6-step window of a jsonl log", 0,
                                             fixtures.external_manifest(traj))
    return out


def check(case: dict, root: Path) -> None:
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
