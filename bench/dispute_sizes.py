"""Fraud-proof sizes computed from shapes (docs/protocol.md §18.6): for each op of a step at a
preset's shapes, the encoded size of a proof over its middle output element, without any tensor.

The proof is the real object — ``FraudProof`` with both signed traces, both records, and exactly
the openings :func:`~open1b.protocol.dispute.proof.fraud_proof_at` would carry (the same
``needed_chunks`` / ``plan`` of r27) — with zero bytes where a chunk's, a slice's or a hash's
content would be, so its encoding has the true length. The trace paths are those of a trace of
``ops`` records, a state tensor's of the preset's state. Each decodes within the referee's bounds
(``FraudProof.decode``: size, CBOR items, schema, both signatures). ``bench/dispute_bench.py`` measures
``small``'s proofs on real data and checks this against them.

    .venv/bin/python bench/dispute_sizes.py [--presets small gpt-125m gpt-1b]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

_Z = bytes(32)


def step_ops(preset_name: str):
    """(label, kind, inputs [(dtype, shape, from the state?)], attrs, output) of a step's ops at the
    preset's shapes: one per distinct (kind, shapes, attributes) that matters for a proof's size,
    labelled as bench/dispute_bench.py labels the ops it measures."""
    from open1b.deterministic import PRESETS

    preset = PRESETS[preset_name]
    c, t = preset.config, preset.topology
    b, T, d, H, V = t.micro_batch_size, c.seq_len, c.d_model, c.n_heads, c.vocab_size
    n, f, hd, bh = b * T, c.d_ff, c.head_dim, b * c.n_heads

    def x(*shape, state=False, dtype="float32"):
        return (dtype, shape, state)

    dense = {"trans_a": 0, "trans_b": 0, "structure": 0}
    mm = [
        ("matmul h @ W_qkv (weight from the state)", [x(n, d), x(d, 3 * d, state=True)], dense),
        ("matmul x @ mlp_fc (weight from the state)", [x(n, d), x(d, f, state=True)], dense),
        ("matmul a @ W_proj (weight from the state)", [x(n, f), x(f, d, state=True)], dense),
        ("matmul du @ W_fc.T (weight from the state)", [x(n, f), x(d, f, state=True)], {**dense, "trans_b": 1}),
        ("matmul xf @ wte.T (logits)", [x(n, d), x(V, d, state=True)], {**dense, "trans_b": 1}),
        ("matmul dlogits @ wte", [x(n, V), x(V, d, state=True)], dense),
        ("matmul x.T @ du (a weight gradient)", [x(n, d), x(n, f)], {**dense, "trans_a": 1}),
        ("matmul a.T @ dx (mlp_proj's gradient)", [x(n, f), x(n, d)], {**dense, "trans_a": 1}),
        ("matmul h.T @ dqkv (attn_qkv's gradient)", [x(n, d), x(n, 3 * d)], {**dense, "trans_a": 1}),
        ("matmul att.T @ dx (attn_out's gradient)", [x(n, d), x(n, d)], {**dense, "trans_a": 1}),
        ("matmul dlogits.T @ xf (the tied table's gradient)", [x(n, V), x(n, d)], {**dense, "trans_a": 1}),
        ("matmul q @ k.T (scores)", [x(bh, T, hd), x(bh, T, hd)], {**dense, "trans_b": 1, "structure": 1}),
        ("matmul p @ v", [x(bh, T, T), x(bh, T, hd)], {**dense, "structure": 2}),
        ("matmul p.T @ do (an attention gradient)", [x(bh, T, T), x(bh, T, hd)], {**dense, "trans_a": 1, "structure": 3}),
        ("matmul do @ v.T", [x(bh, T, hd), x(bh, T, hd)], {**dense, "trans_b": 1, "structure": 1}),
    ]  # fmt: skip
    for label, inputs, attrs in mm:
        yield label, "matmul", inputs, attrs, 0
    scale = {"scale_bits": 0}
    yield "add (residual)", "add", [x(n, d), x(n, d)], {}, 0
    yield "plus_zero (micro-batch fold)", "plus_zero", [x(d, f)], {}, 0
    yield "gelu", "gelu", [x(n, f)], {}, 0
    yield "gelu_backward", "gelu_backward", [x(n, f), x(n, f)], {}, 0
    adamw = dict.fromkeys(("beta1_bits", "one_minus_beta1_bits", "beta2_bits", "one_minus_beta2_bits", "decay_bits",
                           "step_size_bits", "sqrt_bias2_bits", "eps_bits", "coef_bits"), 0)  # fmt: skip
    yield "adamw (mlp_fc, p/m/v from the state)", "adamw", [x(d, f, state=True), x(d, f), x(d, f, state=True),
                                                            x(d, f, state=True)], adamw, 0  # fmt: skip
    yield "rmsnorm (gain from the state)", "rmsnorm", [x(n, d), x(d, state=True)], {"eps_bits": 0}, 0
    yield "causal_softmax", "causal_softmax", [x(bh, T, T)], scale, 0
    yield "cross_entropy (dlogits)", "cross_entropy", [x(n, V), x(n, dtype="int32")], {"inv_n_bits": 0}, 1
    yield "cross_entropy (loss)", "cross_entropy", [x(n, V), x(n, dtype="int32")], {"inv_n_bits": 0}, 0
    yield "rmsnorm_backward (gain from the state)", "rmsnorm_backward", [x(n, d), x(d, state=True), x(n), x(n, d),
                                                                         x(n, d)], {}, 0  # fmt: skip
    yield "causal_softmax_backward", "causal_softmax_backward", [x(bh, T, T), x(bh, T, T)], scale, 0
    yield "sum_rows (a gain's gradient)", "sum_rows", [x(n, d)], {}, 0
    yield "sum_rows (wpe's gradient: dx as (b, T·d))", "sum_rows", [x(b, T * d)], {}, 0
    yield "embed (tables from the state)", "embed", [x(V, d, state=True), x(T, d, state=True),
                                                     x(n, dtype="int32")], {}, 0  # fmt: skip
    yield "scatter_add (the tied table's gradient)", "scatter_add", [x(V, d), x(n, d), x(n, dtype="int32")], {}, 0
    heads = {"seq_len": T, "n_heads": H}
    yield "split_heads (k of qkv)", "split_heads", [x(n, 3 * d)], {**heads, "col0": d, "width": d}, 0
    yield "merge_heads", "merge_heads", [x(bh, T, hd)], heads, 0
    yield "merge_qkv", "merge_qkv", [x(bh, T, hd)] * 3, heads, 0
    yield "sumsq (mlp_fc's gradient)", "sumsq", [x(d, f)], {}, 0
    yield "clip (one sum per parameter)", "clip", [x(1)] * len(c.param_shapes()), {"max_norm_bits": 0}, 0
    yield "zeros", "zeros", [], {"rows": n, "cols": d}, 0


def _path(index: int, count: int) -> tuple[bytes, ...]:
    """A zero path of the length leaf ``index`` of a ``count``-leaf tree has (§6.2)."""
    length = 0
    while count > 1:
        if index ^ 1 < count:
            length += 1
        index, count = index >> 1, (count + 1) // 2
    return (_Z,) * length


def proof_bytes(kind: str, inputs, attrs: dict, output: int, *, ops: int, state_tensors: int) -> dict:
    """The encoded size of a proof over the middle element of output ``output`` of this op, and
    what it carries (module doc)."""
    from open1b.protocol import Identity
    from open1b.protocol.commitments import TensorProof
    from open1b.protocol.dispute.blake3_tree import gaps
    from open1b.protocol.dispute.ops import KINDS, output_shapes
    from open1b.protocol.dispute.proof import FraudProof, Opening
    from open1b.protocol.dispute.reads import (
        SLICE_SIZE,
        SlicedOpening,
        element_reads,
        needed_chunks,
        plan,
        read_by_elements,
    )  # fmt: skip
    from open1b.protocol.dispute.trace import TraceCommitment, chunk_count, chunk_size, nbytes, state_output

    entries = [{"dtype": dt, "shape": list(shape), "root": _Z, **({"state": f"param/{i}"} if st else {"op": i, "out": 0})}
               for i, (dt, shape, st) in enumerate(inputs)]  # fmt: skip
    shapes = output_shapes(kind, attrs, [tuple(e["shape"]) for e in entries])
    out_shape = shapes[output]
    out_state = state_output(kind)
    total = nbytes("float32", out_shape)
    element = math.prod(out_shape) // 2
    size = chunk_size(state=out_state)
    chunk = element * 4 // size
    row = element // (out_shape[-1] if len(out_shape) > 1 else 1)
    modes = KINDS[kind].reads(output, attrs, len(entries))
    reads, carried, sliced = [], 0, 0
    for which, (entry, how) in enumerate(zip(entries, modes)):
        state = "state" in entry
        csize, count = chunk_size(state=state), chunk_count(nbytes(entry["dtype"], entry["shape"]), state=state)
        in_total = nbytes(entry["dtype"], entry["shape"])
        if read_by_elements(entry):
            planned = plan(entry, element_reads(kind, which, entry, how, attrs, out_shape, element)) or []
        else:
            planned = [(c, None) for c in needed_chunks(entry, how, row, attrs)]
        openings = []
        for c, slices in planned:
            if slices is None:
                length = min(csize, in_total - c * csize)
                openings.append(Opening(c, bytes(length), _path(c, count)))
                carried += length
            else:
                openings.append(SlicedOpening(c, slices, bytes(SLICE_SIZE * len(slices)), (_Z,) * len(gaps(slices)),
                                              _path(c, count)))
                carried += SLICE_SIZE * len(slices)
                sliced += len(slices)
        reads.append(tuple(openings))
    state_proof = TensorProof(_Z, 0, 0, _Z, state_tensors, _Z, 0, _path(0, state_tensors))
    out_count = chunk_count(total, state=out_state)
    claimed = Opening(chunk, bytes(min(size, total - chunk * size)), _path(chunk, out_count))
    records = tuple({"pos": ops - 2, "kind": kind, "attrs": attrs, "inputs": entries,
                     "outputs": [{"dtype": "float32", "shape": list(s), "root": bytes([p]) * 32} for s in shapes]}
                    for p in range(2))  # fmt: skip
    traces = tuple(TraceCommitment.create(Identity(bytes([p + 1]) * 32), run=_Z, step=1, pre_state=_Z, post_state=_Z,
                                          ops=ops, root=bytes([p]) * 32) for p in range(2))  # fmt: skip
    proof = FraudProof(traces, ops - 2, records, (_path(ops - 2, ops),) * 2, tuple(reads),
                       tuple(state_proof if "state" in e else None for e in entries), output, chunk, (claimed, claimed))
    data = proof.encode()
    FraudProof.decode(data)  # within the referee's bounds: size, CBOR items, schema, signatures
    return {"proof_bytes": len(data), "input_bytes": carried, "slices": sliced}


def step_op_count(preset_name: str) -> int:
    """About the number of ops of a step (run-format §11.2), for the trace paths' length."""
    from open1b.deterministic import PRESETS

    c, t = PRESETS[preset_name].config, PRESETS[preset_name].topology
    per_micro = 8 + 40 * c.n_layers + 2 * len(c.param_shapes())
    return t.ranks * t.micro_batches * per_micro + 3 * len(c.param_shapes()) + 2


def computed(preset_name: str) -> dict:
    from open1b.deterministic import PRESETS

    params = len(PRESETS[preset_name].config.param_shapes())
    ops, out = step_op_count(preset_name), {}
    for label, kind, inputs, attrs, output in step_ops(preset_name):
        out[label] = proof_bytes(kind, inputs, attrs, output, ops=ops, state_tensors=3 * params)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="*", default=["small", "gpt-125m", "gpt-1b"])
    args = parser.parse_args()
    for p in args.presets:
        for label, row in computed(p).items():
            print(f"{p:9} {label:52} {row['proof_bytes']:>13,} B  ({row['slices']:,} slices)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
