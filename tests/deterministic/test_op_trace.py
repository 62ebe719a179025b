"""The op trace train_step produces (deterministic/op_trace.py, run-format §11): the same bits
as the plain step, one trace whatever the kernels' threads or the activation recompute, and
every record the op the referee re-executes (its inputs are the outputs they name, its outputs
are the reference's bits)."""

import numba
import numpy as np
import pytest

from open1b.deterministic import PRESETS, batch_for_step, builtin_dataset, init_state, train_step
from open1b.deterministic.backend import cpu_backend
from open1b.deterministic.dispute_replay import state_hash_of_chunks
from open1b.deterministic.errors import TraceError
from open1b.deterministic.op_trace import OpTrace, TracingBackend
from open1b.deterministic.runfile import next_state_hash
from open1b.protocol.dispute.ops import rows_of
from open1b.protocol.dispute.reference import compute_rows
from open1b.protocol.dispute.trace import chunk_tree, state_output

PRESET = PRESETS["tiny"]
CONFIG, TOPOLOGY = PRESET.config, PRESET.topology


@pytest.fixture(scope="module")
def step_inputs():
    state = init_state(CONFIG, 0)
    # a second step's state: non-zero moments, so adamw's m and v inputs are not all zeros
    state, _ = train_step(state, batch_for_step(builtin_dataset(CONFIG), 0, 0, CONFIG, TOPOLOGY), TOPOLOGY)
    return state, batch_for_step(builtin_dataset(CONFIG), 0, 1, CONFIG, TOPOLOGY)


def _traced(step_inputs, **kwargs):
    state, batch = step_inputs
    trace = OpTrace(keep=kwargs.pop("keep", frozenset()))
    new_state, report = train_step(state, batch, TOPOLOGY, trace=trace, **kwargs)
    return trace, new_state, report


def test_a_traced_step_has_the_plain_steps_bits(step_inputs):
    state, batch = step_inputs
    plain_state, plain_report = train_step(state, batch, TOPOLOGY, backend=cpu_backend(False))
    _, new_state, report = _traced(step_inputs, backend=cpu_backend(False))
    assert report == plain_report
    assert all(new_state.tensors()[n].tobytes() == t.tobytes() for n, t in plain_state.tensors().items())


def test_the_trace_is_one_whatever_the_threads_and_the_recompute(step_inputs):
    serial = _traced(step_inputs, backend=cpu_backend(False))[0]
    roots = {serial.tree().root}
    before = numba.get_num_threads()
    try:
        for threads in sorted({1, numba.config.NUMBA_NUM_THREADS}):
            numba.set_num_threads(threads)
            for recompute in (True, False):
                trace = _traced(step_inputs, backend=cpu_backend(True), recompute=recompute)[0]
                assert trace.records == serial.records
                roots.add(trace.tree().root)
    finally:
        numba.set_num_threads(before)
    assert len(roots) == 1


def test_the_op_count_is_run_format_11_2s(step_inputs):
    trace = _traced(step_inputs)[0]
    c, t = CONFIG, TOPOLOGY
    params = len(c.param_shapes())
    # per micro-batch: tokens, embed, 16 forward ops a layer, the head's 4 (targets among them),
    # the head's backward 5, 20 backward ops a layer, scatter_add and wpe's sum_rows
    per_micro = 2 + 16 * c.n_layers + 4 + 5 + 20 * c.n_layers + 2
    micro = t.ranks * t.micro_batches
    # the micro-batch fold, then the rank sum (RANK_GROUP > 2 ranks here: a fold as well)
    folds = (params + 1) * (micro + t.ranks)
    assert trace.ops == micro * per_micro + folds + params + 1 + params
    assert [r["pos"] for r in trace.records] == list(range(trace.ops))


def test_every_record_is_its_op_on_the_outputs_it_names(step_inputs):
    """Each input entry is the output (or state tensor) it names, root and bytes; each output
    is what the referee's reference computes from those inputs, bit for bit."""
    state, _ = step_inputs
    trace = _traced(step_inputs, keep=frozenset(range(10_000)))[0]
    tensors = state.tensors()
    seen = set()
    for record in trace.records:
        pos, kind = record["pos"], record["kind"]
        inputs, outputs = trace.kept[pos]
        assert [o["root"] for o in record["outputs"]] == [
            chunk_tree(memoryview(a).cast("B"), state=state_output(kind)).root for a in outputs]
        for entry, value in zip(record["inputs"], inputs):
            if "state" in entry:
                assert tensors[entry["state"]].tobytes() == value.tobytes()
                assert entry["root"] == chunk_tree(memoryview(value).cast("B"), state=True).root
            else:
                source = trace.kept[entry["op"]][1][entry["out"]]
                assert entry["op"] < pos and source.tobytes() == value.tobytes()
                assert entry["root"] == trace.records[entry["op"]]["outputs"][entry["out"]]["root"]
            assert list(value.shape) == entry["shape"]
        if kind == "tokens":
            continue
        for o, out in enumerate(outputs):
            n, _ = rows_of(out.shape)
            want = compute_rows(kind, [np.asarray(v) for v in inputs], record["attrs"], o, 0, n)
            assert want.view(np.uint32).tobytes() == out.reshape(-1).view(np.uint32).tobytes(), (pos, kind, o)
        seen.add(kind)
    assert seen == {"add", "plus_zero", "gelu", "gelu_backward", "adamw", "rmsnorm", "rmsnorm_backward",
                    "causal_softmax", "causal_softmax_backward", "sum_rows", "embed", "scatter_add", "split_heads",
                    "merge_heads", "merge_qkv", "zeros", "sumsq", "clip", "matmul", "cross_entropy"}


def test_the_updates_outputs_are_committed_by_the_new_states_roots(step_inputs):
    """§18.1 (r20): adamw's p, m and v are committed by the state tree's roots of the tensors of
    h_{k+1} they become, and the chunk digests the trace keeps give h_{k+1} as a replay hashes it."""
    state, batch = step_inputs
    trace, new_state, _ = _traced(step_inputs)
    tensors = new_state.tensors()
    updates = [r for r in trace.records if r["kind"] == "adamw"]
    assert len(updates) == len(CONFIG.param_shapes())
    for record, name in zip(updates, CONFIG.param_shapes()):
        names = [f"{prefix}/{name}" for prefix in ("param", "adam_m", "adam_v")]
        assert [o["root"] for o in record["outputs"]] == [
            chunk_tree(memoryview(tensors[n]).cast("B"), state=True).root for n in names]
    assert sorted(trace.post_chunks) == sorted(n for n in tensors if not n.startswith("adam/"))
    prev = b"\x07" * 32
    assert state_hash_of_chunks(prev, new_state, batch, trace.post_chunks) == next_state_hash(prev, new_state, batch)
    wrong = {**trace.post_chunks, "param/wte": trace.post_chunks["adam_m/wte"]}
    assert state_hash_of_chunks(prev, new_state, batch, wrong) != next_state_hash(prev, new_state, batch)


def test_a_device_backend_is_refused():
    class Device:
        name = "cuda-h200"

    with pytest.raises(TraceError):
        TracingBackend(Device(), OpTrace())
