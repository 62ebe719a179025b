"""A disputing party's replay (deterministic/dispute_replay.py) reads checkpoint k in pieces and
updates a tensor at a time, yet gives the whole-state traced step's trace, post-state and op data
bit for bit: the same records, the same tree, and tensor proofs equal to those hashed from the
whole tensors."""

import pytest

from open1b.deterministic import train_step
from open1b.deterministic.dispute_replay import op_data, trace_step
from open1b.deterministic.op_trace import OpTrace
from open1b.deterministic.provenance import checked_run_samples
from open1b.deterministic.replay import before_step
from open1b.deterministic.runfile import (
    load_checkpoint, lr_bits, next_state_hash, state_tensor_bytes, step_batch_digest,
)  # fmt: skip
from open1b.deterministic.data import batch_for_step
from open1b.deterministic.trainer import config_of, publish_run
from open1b.protocol import Identity, tensor_proof
from open1b.protocol.hashing import blake2b256


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("dispute-run")
    return run_dir, publish_run(run_dir, Identity(blake2b256(b"tests/dispute-replay")), steps=2, seed=6)


def _whole(run_dir, manifest, step, keep=frozenset()):
    """The step traced as it was before the streamed replay: the whole checkpoint loaded."""
    config, topology = config_of(manifest)
    dataset = checked_run_samples(run_dir, manifest)
    state = load_checkpoint(run_dir, step, config, manifest.checkpoints[step])
    batch = batch_for_step(dataset, manifest.seed, step, config, topology)
    trace = OpTrace(keep=keep)
    new_state, _ = train_step(state, batch, topology, trace=trace)
    _, prev_batch = before_step(manifest, dataset, step, config, topology)
    return trace, next_state_hash(manifest.state_hashes[step], new_state, batch), state, prev_batch


@pytest.mark.parametrize("step", [0, 1])
def test_the_streamed_trace_is_the_whole_state_trace(run, step):
    run_dir, manifest = run
    traced = trace_step(run_dir, manifest, step)
    trace, post, _, _ = _whole(run_dir, manifest, step)
    assert traced.trace.records == trace.records and traced.tree.root == trace.tree().root
    assert traced.post_state == post == manifest.state_hashes[step + 1]
    assert traced.pre_state == manifest.state_hashes[step]


def test_op_data_proves_state_inputs_as_the_whole_tensors_do(run):
    run_dir, manifest = run
    step = 1
    records = trace_step(run_dir, manifest, step).trace.records
    # the first op with state inputs (the embedding) and the last (an update: parameter and both moments)
    positions = [next(r["pos"] for r in records if any("state" in e for e in r["inputs"])), records[-1]["pos"]]
    for pos in positions:
        trace, _, state, prev_batch = _whole(run_dir, manifest, step, keep=frozenset({pos}))
        inputs, outputs = op_data(run_dir, manifest, step, pos)
        tensors = state_tensor_bytes(state)
        entries = records[pos]["inputs"]
        assert [i.data for i in inputs] == [a.tobytes() for a in trace.kept[pos][0]]
        assert outputs == [a.tobytes() for a in trace.kept[pos][1]]
        proofs = [tensor_proof(manifest.state_hashes[step - 1], step, tensors, step_batch_digest(prev_batch),
                               e["state"], lr_bits=lr_bits(state.config)) if "state" in e else None for e in entries]
        assert [i.state_proof for i in inputs] == proofs and any(p is not None for p in proofs)

