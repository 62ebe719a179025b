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


def corpus_run(run_dir, *, steps: int, seed: int = 3):
    """A run directory of the shipped corpus (``tiny``: samples file, documents in the data map, a
    signed manifest) whose state hashes are placeholders: enough for the data commands, which read
    nothing else, without training. Returns (dataset, manifest)."""
    from open1b.deterministic import PRESETS
    from open1b.deterministic.data import builtin_dataset
    from open1b.deterministic.provenance import write_run_samples
    from open1b.deterministic.runfile import MANIFEST_FILE
    from open1b.deterministic.trainer import run_fields

    tiny = PRESETS["tiny"]
    dataset = builtin_dataset(tiny.config)
    fields = run_fields("tiny", seed, write_run_samples(run_dir, dataset))
    manifest = run_manifest(Identity(blake2b256(b"tests/corpus-run")), **fields, steps=steps,
                            state_hashes=[bytes(32)] * (steps + 1), created_at=1)
    (run_dir / MANIFEST_FILE).write_bytes(manifest.encoded)
    return dataset, manifest
