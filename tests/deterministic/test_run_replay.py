"""Publish a run, replay its steps: matches, the forged step, tampered inputs, the run format."""

import os

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from open1b.deterministic import PRESETS, batch_for_step, builtin_dataset
from open1b.deterministic.device import select_device
from open1b.deterministic import provenance
from open1b.deterministic.errors import CheckpointMismatchError, EngineMismatchError, RunFormatError, SamplesMismatchError
from open1b.deterministic.replay import replay
from open1b.deterministic.runfile import (
    ENGINE, ENGINE_VERSION, as_tensor_bytes, checkpoint_path, load_checkpoint, max_checkpoint_bytes, step_batch_digest,
)  # fmt: skip
from open1b.deterministic.trainer import config_of, publish_run
from open1b.protocol import Identity, RunManifest, batch_digest
from open1b.protocol.hashing import blake2b256
from open1b.protocol.witness import witness_commitment

PRESET = PRESETS["tiny"]


@pytest.fixture(scope="module")
def forged_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    manifest = publish_run(run_dir, Identity(blake2b256(b"trainer")), steps=3, seed=4, tamper_step=1)
    return run_dir, manifest


def test_train_and_replay_on_a_chosen_device(forged_run, tmp_path):
    # The entry points take the device select_device chose (here the CPU: no GPU in CI); the
    # run's bits are the default's, and a replay on the chosen device matches the published chain.
    device = select_device("cpu")
    manifest = publish_run(tmp_path, Identity(blake2b256(b"trainer")), steps=3, seed=4, tamper_step=1, device=device)
    assert manifest.state_hashes == forged_run[1].state_hashes
    assert [replay(tmp_path, k, manifest, device=device).match for k in range(3)] == [True, False, True]


def test_manifest_carries_engine_preset_config_and_topology(forged_run):
    _, manifest = forged_run
    assert (manifest.engine, manifest.engine_version) == (ENGINE, ENGINE_VERSION)
    assert manifest.model["preset"] == "tiny"
    assert config_of(manifest) == (PRESET.config, PRESET.topology)


def test_replay_matches_every_honest_step_and_exposes_the_forged_one(forged_run):
    run_dir, manifest = forged_run
    results = [replay(run_dir, k, manifest) for k in range(3)]
    assert [r.match for r in results] == [True, False, True]
    assert all(r.pre_state == manifest.state_hashes[r.step] for r in results)
    assert results[1].post_state != manifest.state_hashes[2]
    # The replay witness is the one the trainer committed to, for the forged step too: the
    # forgery happened after the step's gradients were computed.
    assert [witness_commitment(r.witness) for r in results] == manifest.witnesses


def test_every_checkpoint_has_the_address_the_manifest_names(forged_run):
    run_dir, manifest = forged_run
    assert [blake2b256(checkpoint_path(run_dir, k).read_bytes()) for k in range(4)] == manifest.checkpoints


def test_a_tampered_checkpoint_is_refused_before_the_step_runs(forged_run, tmp_path):
    # Even the lowest bit of a moment, which the step itself might round away, changes h_k.
    run_dir, manifest = forged_run
    copy = tmp_path / "run"
    (copy / "checkpoints").mkdir(parents=True)
    for name in ("manifest.cbor", "samples.bin"):
        (copy / name).write_bytes((run_dir / name).read_bytes())
    for k in range(4):
        checkpoint_path(copy, k).write_bytes(checkpoint_path(run_dir, k).read_bytes())
    tensors = load_file(str(checkpoint_path(copy, 2)))
    tensors["adam_m/h1.mlp_fc"].view(np.uint32)[0, 0] ^= 1
    save_file(tensors, str(checkpoint_path(copy, 2)))
    with pytest.raises(CheckpointMismatchError):
        replay(copy, 2, manifest)
    assert replay(copy, 0, manifest).match


def test_samples_are_checked_once_per_file_and_again_for_a_rewrite_or_another_file(forged_run, tmp_path, monkeypatch):
    # Replays and spot checks share one check of the run's samples (one hard-linked blob in each
    # working directory): a second step does not read the file again, but a rewritten or another
    # file is checked before use.
    run_dir, manifest = forged_run
    copy = tmp_path / "run"
    copy.mkdir()
    for name in ("manifest.cbor", "samples.bin"):
        (copy / name).write_bytes((run_dir / name).read_bytes())
    (tmp_path / "linked").mkdir()
    os.link(copy / "samples.bin", tmp_path / "linked" / "samples.bin")
    reads = []
    real = provenance.load_run_samples
    monkeypatch.setattr(provenance, "load_run_samples", lambda d, m: reads.append(d) or real(d, m))
    first = provenance.checked_run_samples(copy, manifest)
    assert provenance.checked_run_samples(copy, manifest) is first
    assert provenance.checked_run_samples(tmp_path / "linked", manifest) is first  # the same file
    assert reads == [copy]
    data = bytearray((copy / "samples.bin").read_bytes())
    data[-1] ^= 1  # a token of the last sample: its digest, so the root, changes
    (copy / "samples.bin").write_bytes(bytes(data))
    with pytest.raises(SamplesMismatchError):
        provenance.checked_run_samples(copy, manifest)
    with pytest.raises(SamplesMismatchError):
        replay(copy, 0, manifest)
    assert provenance.checked_run_samples(run_dir, manifest).n == first.n  # another file: read, and sound
    assert reads == [copy, copy, copy, run_dir]


def test_engine_and_range_are_checked(forged_run):
    run_dir, manifest = forged_run
    fields = {k: v for k, v in manifest.body().items() if k not in ("kind", "v", "publisher")}
    fields["engine_version"] = "9.9.9"
    other = RunManifest.create(Identity(blake2b256(b"x")), **fields)
    with pytest.raises(EngineMismatchError):
        replay(run_dir, 0, other)
    with pytest.raises(RunFormatError):
        replay(run_dir, 3, manifest)


def test_batch_digest_lists_each_rank_in_order():
    batch = batch_for_step(builtin_dataset(PRESET.config), 4, 0, PRESET.config, PRESET.topology)
    per_rank = [as_tensor_bytes(batch[r]) for r in range(batch.shape[0])]
    assert step_batch_digest(batch) == batch_digest(per_rank)
    assert step_batch_digest(batch) != step_batch_digest(batch[::-1].copy())


def test_oversized_checkpoint_is_refused_before_parsing(forged_run, tmp_path):
    run_dir, _ = forged_run
    limit = max_checkpoint_bytes(PRESET.config)
    assert checkpoint_path(run_dir, 0).stat().st_size <= limit
    big = tmp_path / "checkpoints" / "00000000.safetensors"
    big.parent.mkdir()
    big.write_bytes(b"\0" * (limit + 1))
    with pytest.raises(RunFormatError, match="more than the .* allowed"):
        load_checkpoint(tmp_path, 0, PRESET.config)


def test_a_state_is_always_written_as_the_same_bytes(tmp_path):
    # Its address is in the manifest: two writers of one state must agree on the file.
    from open1b.deterministic import init_state
    from open1b.deterministic.runfile import save_checkpoint

    state = init_state(PRESET.config, 5)
    addresses = {save_checkpoint(tmp_path / str(i), state) for i in range(12)}
    assert len(addresses) == 1
