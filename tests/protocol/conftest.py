import pytest

from open1b.protocol import Attestation, Claim, Identity, RunManifest
from open1b.protocol.hashing import blake2b256
from tests.runs import run_manifest, attestation

NOW = 1_800_000_000


def ident(n: int) -> Identity:
    return Identity(blake2b256(b"test-identity", bytes([n])))


def make_manifest(publisher: Identity, steps: int = 4) -> RunManifest:
    hashes = [blake2b256(b"state", bytes([k])) for k in range(steps + 1)]
    return run_manifest(
        publisher, engine="test-engine", engine_version="1", model={"d": 8, "lr": 0.01},
        data={"corpus": "x"}, seed=7, steps=steps, state_hashes=hashes, created_at=NOW,
    )


def make_attestation(signer: Identity, manifest: RunManifest, step: int, *, match: bool = True,
                     issued_at: int = NOW) -> Attestation:
    post = manifest.state_hashes[step + 1] if match else blake2b256(b"other", bytes([step]))
    return attestation(
        signer, run=manifest.run_id, step=step, pre_state=manifest.state_hashes[step], post_state=post,
        verdict="match" if match else "mismatch", engine=manifest.engine,
        engine_version=manifest.engine_version, hardware="test", device="cpu/x86_64-avx2", elapsed_ms=12, issued_at=issued_at,
    )


def make_claim(claimant: Identity, manifest: RunManifest, step: int, *, issued_at: int = NOW,
               lease: int = 60, slot: int = 0) -> Claim:
    return Claim.create(claimant, run=manifest.run_id, step=step, slot=slot, issued_at=issued_at,
                        lease_expiry=issued_at + lease)


@pytest.fixture
def publisher() -> Identity:
    return ident(0)


@pytest.fixture
def manifest(publisher: Identity) -> RunManifest:
    return make_manifest(publisher)
