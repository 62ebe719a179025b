"""Publish a run, replay its steps: matches, the forged step, tampered inputs, the run format."""

import os

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from open1b.deterministic import PRESETS, batch_for_step, builtin_dataset, init_state, train_step
from open1b.deterministic.device import select_device
from open1b.deterministic import provenance
from open1b.deterministic.errors import CheckpointMismatchError, EngineMismatchError, RunFormatError, SamplesMismatchError
from open1b.deterministic.replay import replay
from open1b.deterministic.runfile import (
    ENGINE, ENGINE_VERSION, RunWriter, as_tensor_bytes, checkpoint_path, load_checkpoint, max_checkpoint_bytes,
    step_batch_digest,
)  # fmt: skip
from open1b.deterministic.trainer import config_of, publish_run, run_fields
from open1b.protocol import Identity, RunManifest, batch_digest
from open1b.protocol.hashing import blake2b256
from open1b.protocol.witness import WITNESS_KEY, WITNESS_SEQUENTIAL, WITNESS_TREE, witness_commitment

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
    assert manifest.data[WITNESS_KEY] == WITNESS_TREE  # the witness rule it was trained with
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


def _resigned(manifest: RunManifest, **changes) -> RunManifest:
    fields = {k: v for k, v in manifest.body().items() if k not in ("kind", "v", "publisher")}
    return RunManifest.create(Identity(blake2b256(b"x")), **{**fields, **changes})


def test_engine_witness_rule_and_range_are_checked(forged_run):
    run_dir, manifest = forged_run
    with pytest.raises(EngineMismatchError):
        replay(run_dir, 0, _resigned(manifest, engine_version="9.9.9"))
    with pytest.raises(RunFormatError, match="witness rule"):
        replay(run_dir, 0, _resigned(manifest, data={**manifest.data, WITNESS_KEY: "open1b/witness/v9"}))
    with pytest.raises(RunFormatError):
        replay(run_dir, 3, manifest)


# A tiny run (2 steps, seed 7, no fingerprints) as engine 0.4.0 published it, before the chunk-tree
# witness: h_0 … h_2 and C_0, C_1 of its manifest, computed by that engine.
V1_RUN_STATE_HASHES = [
    "19b0ec070477d083651ce48d8d713f028c64ec920ff8ac172180e0ccab45b0fb",
    "299d05fb31fcd0d2bb6702b80cc57a4cfe6af3343de7fb4d9eddbf324876847d",
    "0d3476d62ac29b47a12ec098cf2c7992f3c2023197b5ae6770791f387b5407fe",
]
V1_RUN_WITNESSES = [
    "cc2621dba692f60a12b210ff6d7d7f661a5219d675b3e86e9a07383b524410fc",
    "95044a9dfb803694d59104ba8636cf615447d54e7f974ea50a89b86db16bd493",
]


def test_a_run_of_engine_0_4_with_the_sequential_witness_still_replays_and_matches(tmp_path):
    # Trained as engine 0.4.0 trained it: no `witness` key in its data map, each W_k by rule v1.
    # The pins show these are that engine's bytes (genesis, chain and witnesses); this engine
    # reads the rule from the run, so its replay matches and its W_k opens each C_k.
    config, topology, seed = PRESET.config, PRESET.topology, 7
    dataset = builtin_dataset(config)
    fields = run_fields("tiny", seed, provenance.write_run_samples(tmp_path, dataset))
    assert fields["data"].pop(WITNESS_KEY) == WITNESS_TREE  # what a new run records
    writer = RunWriter(tmp_path, {**fields, "engine_version": "0.4.0"})
    state = init_state(config, seed)
    writer.start(state)
    for k in range(2):
        batch = batch_for_step(dataset, seed, k, config, topology)
        state, report = train_step(state, batch, topology, witness_rule=WITNESS_SEQUENTIAL)
        writer.record(state, batch, report.witness)
    manifest = writer.finish(Identity(blake2b256(b"trainer")), created_at=1)
    assert [h.hex() for h in manifest.state_hashes] == V1_RUN_STATE_HASHES
    assert [c.hex() for c in manifest.witnesses] == V1_RUN_WITNESSES
    results = [replay(tmp_path, k) for k in range(2)]
    assert all(r.match for r in results)
    assert [witness_commitment(r.witness) for r in results] == manifest.witnesses


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
