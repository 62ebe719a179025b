"""The op trace train_step produces (deterministic/op_trace.py, run-format §11): the same bits
as the plain step, one trace whatever the kernels' threads or the activation recompute, and
every record the op the referee re-executes (its inputs are the outputs they name, its outputs
are the reference's bits)."""

import dataclasses

import numba
import numpy as np
import pytest

from open1b.deterministic import PRESETS, batch_for_step, builtin_dataset, init_state, train_step
from open1b.deterministic.backend import cpu_backend
from open1b.deterministic.config import Topology
from open1b.deterministic.dispute_replay import state_hash_of_chunks
from open1b.deterministic.errors import TraceError
from open1b.deterministic.op_trace import OpTrace, TracingBackend
from open1b.deterministic.reduction import RANK_GROUP
from open1b.deterministic.runfile import next_state_hash
from open1b.protocol.dispute.ops import KINDS, rows_of
from open1b.protocol.dispute.reference import compute_rows
from open1b.protocol.dispute.trace import chunk_tree, op_leaf, state_output

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


# §11.2's op lists, kind by kind (the attributes aside)
_LAYER = ("ln1", "attn_qkv", "attn_out", "ln2", "mlp_fc", "mlp_proj")
_LAYER_FORWARD = ("rmsnorm", "matmul", "split_heads", "split_heads", "split_heads", "matmul", "causal_softmax",
                  "matmul", "merge_heads", "matmul", "add", "rmsnorm", "matmul", "gelu", "matmul", "add")
_HEAD = ("rmsnorm", "matmul", "tokens", "cross_entropy", "matmul", "matmul", "zeros", "rmsnorm_backward", "sum_rows")
_LAYER_BACKWARD = ("matmul", "matmul", "gelu_backward", "matmul", "matmul", "rmsnorm_backward", "sum_rows", "matmul",
                   "matmul", "split_heads", "matmul", "matmul", "causal_softmax_backward", "matmul", "matmul",
                   "merge_qkv", "matmul", "matmul", "rmsnorm_backward", "sum_rows")


def _ops_of_the_text(config, ranks: int, micro_batches: int) -> list[tuple[str, str | None]]:
    """Run-format §11.2 items 1-4 read as written, independently of the engine: each op's kind
    and, for the sums of gradients (the micro-batch fold and the rank sum), sumsq and adamw, the
    name it acts on (None for every other op)."""
    layers, order = config.n_layers, list(config.param_shapes())
    names = [[f"h{layer}.{p}" for p in _LAYER] for layer in range(layers)]
    grad_order = ["ln_f", *(n for layer in reversed(range(layers)) for n in names[layer]), "wte", "wpe", "loss"]
    ops: list[tuple[str, str | None]] = []

    def plain(kinds):
        ops.extend((kind, None) for kind in kinds)

    for r in range(ranks):
        def pair(name):  # the last micro-batch's fold op, then the push of the rank's term
            ops.append(("plus_zero" if micro_batches == 1 else "add", name))
            ops.append(("plus_zero" if r % RANK_GROUP == 0 else "add", name))

        for mu in range(micro_batches):
            last = mu == micro_batches - 1
            plain(("tokens", "embed", *_LAYER_FORWARD * layers, *_HEAD))
            if last:
                pair("ln_f")
            for layer in reversed(range(layers)):
                plain(_LAYER_BACKWARD)
                if last:
                    for name in names[layer]:
                        pair(name)
            plain(("scatter_add", "sum_rows"))
            if last:
                for name in ("wte", "wpe", "loss"):
                    pair(name)
            else:
                ops.extend(("plus_zero" if mu == 0 else "add", name) for name in [*order, "loss"])
        if r % RANK_GROUP == RANK_GROUP - 1 or r == ranks - 1:  # the group is complete: its push
            c, level = r // RANK_GROUP, 0
            while (c >> level) & 1:
                ops.extend(("add", name) for name in grad_order)
                level += 1
    pushed = -(-ranks // RANK_GROUP)  # the final total: one add a name per waiting block but the lowest
    for _ in range(bin(pushed).count("1") - 1):
        ops.extend(("add", name) for name in grad_order)
    ops.extend(("sumsq", name) for name in order)
    ops.append(("clip", None))
    ops.extend(("adamw", name) for name in order)
    return ops


def _ops_of_the_trace(trace: OpTrace) -> list[tuple[str, str | None]]:
    """The trace's kinds, each sum of gradients, sumsq and adamw named by the tensor it acts on as
    the records' entries say: adamw by its parameter's state entry, then back through the `add`s
    and `plus_zero`s its gradient input comes from; the loss's sums forward from cross_entropy's
    loss output; a sumsq by its input's name."""
    records = trace.records
    name: dict[int, str] = {}
    for record in records:
        sources = [e for e in record["inputs"] if "op" in e]
        if record["kind"] in ("add", "plus_zero") and sources and all(
                name.get(e["op"]) == "loss" or (records[e["op"]]["kind"] == "cross_entropy" and e["out"] == 0)
                for e in sources):
            name[record["pos"]] = "loss"
        elif record["kind"] == "adamw":
            param = record["inputs"][0]["state"].split("/", 1)[1]
            name[record["pos"]], todo = param, [record["inputs"][1]["op"]]
            while todo:
                pos = todo.pop()
                if records[pos]["kind"] in ("add", "plus_zero"):
                    name[pos] = param
                    todo.extend(e["op"] for e in records[pos]["inputs"])
    for record in records:  # the sumsqs come before the adamws that name their inputs
        if record["kind"] == "sumsq":
            name[record["pos"]] = name.get(record["inputs"][0]["op"])
    return [(r["kind"], name.get(r["pos"]) if r["kind"] in ("add", "plus_zero", "sumsq", "adamw") else None)
            for r in records]


@pytest.mark.parametrize("ranks, micro_batches", [(1, 1), (1, 3), (3, 2), (RANK_GROUP + 1, 1), (2 * RANK_GROUP + 1, 1)])
def test_the_trace_is_run_format_11_2s_list_in_order(ranks, micro_batches):
    """Every op where §11.2 puts it, the sums of gradients (folded in the last micro-batch as each
    gradient is final, the rank sum's pushes and its tree) on the names the text says; more than
    RANK_GROUP ranks for the tree's adds, twice that and one for a push that merges."""
    topology = Topology(ranks=ranks, micro_batches=micro_batches, micro_batch_size=1)
    trace = OpTrace()
    train_step(init_state(CONFIG, 0), batch_for_step(builtin_dataset(CONFIG), 0, 0, CONFIG, topology), topology,
               trace=trace)
    assert _ops_of_the_trace(trace) == _ops_of_the_text(CONFIG, ranks, micro_batches)


def test_tinys_trace_is_run_format_11_2s_list_in_order(step_inputs):
    """The preset's 2 ranks × 2 micro-batches. r23's text (every fold after its backward, the rank
    sum's adds after the rank's last micro-batch, names in P order) gives as many ops of the same
    kinds at other positions, which the op count above does not see and this does."""
    assert _ops_of_the_trace(_traced(step_inputs)[0]) == _ops_of_the_text(
        CONFIG, TOPOLOGY.ranks, TOPOLOGY.micro_batches)


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


def test_the_leaves_are_op_leaf_of_the_records(step_inputs):
    """OpTrace.append hashes a record's plain CBOR, its maps built in canonical key order: the
    leaves are §18.1's (op_leaf's canonical encoding), for every kind and its attributes, a state
    input, an op's output and a view of one (the whole-state step reshapes some)."""
    trace = _traced(step_inputs)[0]
    assert {r["kind"] for r in trace.records} == {*KINDS, "tokens"}
    assert trace.leaves == [op_leaf(r) for r in trace.records]


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


@pytest.mark.parametrize("negative_zero", [False, True])
def test_a_fold_of_plus_zero_has_its_outputs_root(negative_zero):
    """plus_zero's output takes its input's root only where the bytes are the same: an input
    holding -0.0 (which the fold turns into +0.0) has its output hashed."""
    state = init_state(CONFIG, 0)
    tokens = np.arange(CONFIG.seq_len, dtype=np.int32)
    if negative_zero:  # embed's first element: -0.0 + -0.0
        tables = {n: state.params[n].copy() for n in ("wte", "wpe")}
        tables["wte"][0, 0] = tables["wpe"][0, 0] = np.float32(-0.0)
        state = dataclasses.replace(state, params={**state.params, **tables})
    trace = OpTrace()
    be = TracingBackend(cpu_backend(False), trace)
    params, _, _ = be.load_state(state)
    x = be.embed(params["wte"], params["wpe"], tokens)
    out = be.plus_zero(x)
    assert np.signbit(x[0, 0]) == negative_zero and not np.signbit(out[0, 0])
    embed, fold = trace.records[-2:]
    assert fold["outputs"][0]["root"] == chunk_tree(memoryview(out).cast("B")).root
    assert (fold["outputs"][0]["root"] == embed["outputs"][0]["root"]) != negative_zero
