"""A state a tensor at a time (deterministic/checkpoint_stream.py): the same file bytes, hashes and
step results as whole states, pinned to the bits the whole-state code gave before it existed."""

import json
import struct

import numpy as np
import pytest

from open1b.deterministic import PRESETS, init_state, train_step
from open1b.deterministic.checkpoint_stream import (
    CheckpointWriter, StateSink, canonical_header, parse_header, scan_checkpoint, scanned_state, state_shapes,
)  # fmt: skip
from open1b.deterministic.data import batch_for_step
from open1b.deterministic.errors import CheckpointMismatchError, RunFormatError
from open1b.deterministic.provenance import checked_run_samples
from open1b.deterministic.replay import replay
from open1b.deterministic.runfile import (
    checkpoint_path, load_checkpoint, next_state_hash, save_checkpoint, state_tensor_bytes,
)  # fmt: skip
from open1b.deterministic.trainer import config_of, publish_run
from open1b.protocol import Identity
from open1b.protocol.commitments import state_root
from open1b.protocol.hashing import blake2b256
from open1b.protocol.witness import WITNESS_SEQUENTIAL, witness_commitment

TINY = PRESETS["tiny"].config

# The run `publish_run(steps=2, seed=4)` of `tiny`, as the whole-state trainer and replayer wrote and
# replayed it before the streamed ones replaced them (recorded from commit 49fe3ec, engine 0.4.0).
# Its checkpoint files are pinned byte for byte; its witnesses are those of the rule runs had then
# (v1), committed as a manifest commits them. The state hashes chain from the manifest (engine 0.5.0 and witness v2 now), so they are
# checked against the whole-state hashing of the pinned checkpoints instead.
PINNED_RUN = {
    "checkpoints": ["d13aa38d2fa9eeed47bf2451415ede390da3d38854446f9dcb0190cb7bef8ae9",
                    "4772527e43f461040ec79533c072a93ed4b20875fe9589dc8ced6bc2fcf76647",
                    "af48e182cec271761507c54b09e6b3652e2b91b1749d50eca3a891e113000ae7"],
    "witnesses": ["0f0b3323affce81e5d57248b3a32bb2b80bd87f87497d77af15fe2793d555a09",
                  "469e3fc40fc7f0d93ddadac8c92116028be9e4d55923fe43cf8679ce235eb1c7"],
}  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    return run_dir, publish_run(run_dir, Identity(blake2b256(b"trainer")), steps=2, seed=4)


def test_the_streamed_trainer_writes_the_pinned_run(run):
    run_dir, manifest = run
    assert [c.hex() for c in manifest.checkpoints] == PINNED_RUN["checkpoints"]
    config, topology = config_of(manifest)
    dataset = checked_run_samples(run_dir, manifest)
    for k in range(manifest.steps):
        state = load_checkpoint(run_dir, k, config, manifest.checkpoints[k])
        batch = batch_for_step(dataset, manifest.seed, k, config, topology)
        nxt = load_checkpoint(run_dir, k + 1, config, manifest.checkpoints[k + 1])
        assert next_state_hash(manifest.state_hashes[k], nxt, batch) == manifest.state_hashes[k + 1]
        _, v1 = train_step(state, batch, topology, witness_rule=WITNESS_SEQUENTIAL)
        assert witness_commitment(v1.witness).hex() == PINNED_RUN["witnesses"][k]
        assert witness_commitment(train_step(state, batch, topology)[1].witness) == manifest.witnesses[k]  # v2


def test_the_streamed_replay_gives_the_pinned_and_the_whole_state_results(run, tmp_path):
    run_dir, manifest = run
    out = tmp_path / "state2.safetensors"
    result = replay(run_dir, 1, manifest, out=out)
    assert result.match and result.post_state == manifest.state_hashes[2]
    assert blake2b256(out.read_bytes()) == manifest.checkpoints[2]  # --out writes the published file's bytes
    # the whole-state path, still what a device backend runs, agrees bit for bit
    config, topology = config_of(manifest)
    dataset = checked_run_samples(run_dir, manifest)
    state = load_checkpoint(run_dir, 1, config, manifest.checkpoints[1])
    batch = batch_for_step(dataset, manifest.seed, 1, config, topology)
    whole, report = train_step(state, batch, topology)
    assert next_state_hash(manifest.state_hashes[1], whole, batch) == result.post_state
    assert report.witness == result.witness and report.loss.tobytes() == np.float32(result.loss).tobytes()


def test_a_writer_in_any_order_gives_save_checkpoints_bytes_and_the_state_root(tmp_path):
    state = init_state(TINY, 5)
    address = save_checkpoint(tmp_path / "whole", state)
    writer = CheckpointWriter(tmp_path / "streamed.safetensors", TINY, 0)
    sink = StateSink(TINY, writer)
    tensors = state.tensors()
    for name in reversed(list(tensors)):
        sink.add(name, tensors[name])
    assert writer.finish() == address
    assert (tmp_path / "streamed.safetensors").read_bytes() == checkpoint_path(tmp_path / "whole", 0).read_bytes()
    assert sink.root() == state_root(state_tensor_bytes(state))


def test_a_scan_gives_the_address_the_state_root_and_the_parameters(tmp_path):
    state = init_state(TINY, 6)
    address = save_checkpoint(tmp_path, state)
    scan = scan_checkpoint(checkpoint_path(tmp_path, 0), TINY, 0)
    assert scan.address == address and scan.state_root() == state_root(state_tensor_bytes(state))
    assert set(scan.kept) == {f"param/{n}" for n in TINY.param_shapes()}
    loaded = scanned_state(scan, TINY, 0)
    assert not scan.kept  # moved: the update must be able to drop each old parameter
    for name in TINY.param_shapes():
        for mine, theirs in ((loaded.params, state.params), (loaded.m, state.m), (loaded.v, state.v)):
            assert mine[name].tobytes() == theirs[name].tobytes()
    assert (loaded.beta1_pow, loaded.beta2_pow) == (state.beta1_pow, state.beta2_pow)


def test_a_moment_that_changes_after_the_scan_is_refused_when_read(tmp_path):
    # the update reads each moment again: the bytes it uses must be the bytes whose hash was checked
    state = init_state(TINY, 6)
    save_checkpoint(tmp_path, state)
    path = checkpoint_path(tmp_path, 0)
    scan = scan_checkpoint(path, TINY, 0)
    loaded = scanned_state(scan, TINY, 0)
    slot = scan.slots["adam_v/h1.mlp_fc"]
    data = bytearray(path.read_bytes())
    data[slot.offset + 8] ^= 1
    path.write_bytes(bytes(data))
    assert loaded.m["h1.mlp_fc"].tobytes() == state.m["h1.mlp_fc"].tobytes()  # another tensor: untouched
    with pytest.raises(CheckpointMismatchError):
        loaded.v["h1.mlp_fc"]


def _header_with(edit) -> tuple[bytes, int]:
    header, slots = canonical_header(TINY, 3)
    entries = json.loads(header[8:])
    edit(entries)
    text = json.dumps(entries).encode()
    size = 8 + len(text) + sum(s.nbytes for s in slots.values())
    return struct.pack("<Q", len(text)) + text, size


@pytest.mark.parametrize("edit", [
    lambda e: e.update({"__metadata__": {"open1b_checkpoint_step": "4"}}),  # another checkpoint's
    lambda e: e.pop("adam/beta2_pow"),  # a tensor missing
    lambda e: e["param/wpe"].update(shape=[1, 64 * 32]),  # the same bytes, another shape
    lambda e: e["param/ln_f"].update(dtype="I32"),
    lambda e: e["adam/beta1_pow"].update(data_offsets=[4, 8]),  # overlaps adam/beta2_pow
], ids=["step", "missing", "shape", "dtype", "overlap"])
def test_a_header_of_another_state_is_refused(edit):
    header, size = _header_with(lambda e: None)
    parse_header(header, size, TINY, 3)  # the unedited header passes
    header, size = _header_with(edit)
    with pytest.raises(RunFormatError):
        parse_header(header, size, TINY, 3)


def test_a_scan_refuses_a_file_larger_than_the_model_allows(tmp_path):
    path = tmp_path / "big.safetensors"
    shapes = state_shapes(TINY)
    path.write_bytes(b"\0" * (4 * sum(int(np.prod(s)) for s in shapes.values()) + (1 << 20) + 1))
    with pytest.raises(RunFormatError, match="more than the .* allowed"):
        scan_checkpoint(path, TINY, 0)
