"""Signed statements for tests that need a well-formed run but not a trained one.

A synthetic run's step k has the replay witness :func:`witness_of` (k), and the manifest
commits to it, so an attestation built here is honest about the witness unless a test says
otherwise (``witness=...``).
"""

from __future__ import annotations

from open1b.protocol import RUN_FORMAT, Attestation, Identity, RunManifest, blake2b256
from open1b.protocol.witness import witness_binding, witness_commitment


def witness_of(step: int) -> bytes:
    return blake2b256(b"tests/witness", step.to_bytes(8, "little"))


def run_manifest(identity: Identity, **fields) -> RunManifest:
    """``RunManifest.create`` with the run-format-2 fields a test does not care about filled in."""
    steps = fields["steps"]
    defaults = {
        "format": RUN_FORMAT,
        "checkpoints": [blake2b256(b"tests/checkpoint", k.to_bytes(8, "little")) for k in range(steps + 1)],
        "witnesses": [witness_commitment(witness_of(k)) for k in range(steps)],
        "samples_root": blake2b256(b"tests/samples-root"),
        "samples": 64,
        "samples_blob": blake2b256(b"tests/samples-blob"),
        "samples_size": 64 * 33 * 4,
    }
    return RunManifest.create(identity, **{**defaults, **fields})


def attestation(identity: Identity, **fields) -> Attestation:
    """``Attestation.create`` with an honest witness binding unless ``witness`` is given."""
    if "witness" not in fields:
        fields["witness"] = witness_binding(fields["run"], fields["step"], identity.public_key, witness_of(fields["step"]))
    return Attestation.create(identity, **fields)
