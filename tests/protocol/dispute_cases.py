"""Random ops of every kind the referee re-executes, run through deterministic/'s kernels, and two
signed traces around one of them — an honest party's and a forger's whose output differs by one
ulp in one element — from which a fraud proof is built. Shared by the referee's tests, the
``dispute`` vectors and bench/dispute_bench.py."""

from __future__ import annotations

import dataclasses

import numpy as np

from open1b.deterministic import activation, attention, backend, embedding, loss, matmul, norm, optimizer, reduction
from open1b.deterministic.attention import attention_scale
from open1b.protocol import TensorBytes, state_hash, tensor_proof
from open1b.protocol.dispute.ops import KINDS
from open1b.protocol.dispute.proof import InputBytes, make_fraud_proof
from open1b.protocol.dispute.trace import TraceCommitment, state_output, tensor, trace_tree
from open1b.protocol.hashing import blake2b256

F = np.float32


def bits(x) -> int:
    return int(np.float32(x).view(np.uint32))


def randn(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(F)


def adamw_scalars(coef=0.731):
    return optimizer.AdamWScalars.for_step(lr=F(6e-4), beta1=F(0.9), beta2=F(0.95), eps=F(1e-8), weight_decay=F(0.1),
                                           beta1_pow=F(0.9**3), beta2_pow=F(0.95**3), coef=F(coef))


SCALES = {
    "test": (10, 96, 70, 256, 70),  # rows unit, width, sequence, vocabulary, reduction length
    "vector": (2, 12, 9, 16, 40),  # small enough to spell out; K > 32 still exercises the tree
}


def kernel_case(kind: str, rng, scale: str = "test"):
    """(inputs, attrs, the kernel's outputs) of one random op of ``kind`` at ``SCALES[scale]``."""
    n, w, t_len, vocab, k = SCALES[scale]
    if kind == "add":
        a, b = randn(rng, 7 * n, w), randn(rng, 7 * n, w)
        return [a, b], {}, [reduction.KERNELS[False][2](a, b)]
    if kind == "plus_zero":
        a = randn(rng, 3 * n * w)
        a[::7] = -0.0
        return [a], {}, [reduction.KERNELS[False][3](a)]
    if kind == "gelu":
        u = randn(rng, 4 * n, w, scale=4.0)
        return [u], {}, [activation.KERNELS[False][0](u)]
    if kind == "gelu_backward":
        u, dy = randn(rng, 4 * n, w, scale=4.0), randn(rng, 4 * n, w)
        return [u, dy], {}, [activation.KERNELS[False][1](u, dy)]
    if kind == "adamw":
        p, g, m = randn(rng, 3 * n + 3, w), randn(rng, 3 * n + 3, w), randn(rng, 3 * n + 3, w, scale=0.1)
        v = np.abs(randn(rng, 3 * n + 3, w, scale=0.01))
        s = adamw_scalars()
        attrs = dict(zip(KINDS["adamw"].attrs, map(bits, s.args())))
        return [p, g, m, v], attrs, list(optimizer.KERNELS[False](p, g, m, v, *s.args()))
    if kind == "rmsnorm":
        x, g, eps = randn(rng, 5 * n, w, scale=3.0), randn(rng, w), F(1e-5)
        y, rstd = norm.KERNELS[False][0](x, g, eps)
        return [x, g], {"eps_bits": bits(eps)}, [y, rstd]
    if kind == "rmsnorm_backward":
        x, g, dy, dres = randn(rng, 5 * n, w, scale=3.0), randn(rng, w), randn(rng, 5 * n, w), randn(rng, 5 * n, w)
        _, rstd = norm.KERNELS[False][0](x, g, F(1e-5))
        return [x, g, rstd, dy, dres], {}, list(norm.KERNELS[False][1](x, g, rstd, dy, dres))
    if kind == "causal_softmax_backward":
        p = attention.KERNELS[False][3](randn(rng, 3, t_len, t_len, scale=5.0), F(0.125))
        dp, scale_ = randn(rng, 3, t_len, t_len), attention_scale(64)
        return [p, dp], {"scale_bits": bits(scale_)}, [attention.KERNELS[False][4](p, dp, scale_)]
    if kind == "sum_rows":
        x = randn(rng, 7 * n + 40, w)  # more rows than one chunk of 32: the tree is used
        return [x], {}, [reduction.KERNELS[False][0](x)]
    if kind == "embed":
        wte, wpe = randn(rng, vocab, w), randn(rng, t_len, w)
        tokens = rng.integers(0, vocab, 2 * t_len).astype(np.int32)
        return [wte, wpe, tokens], {}, [embedding.KERNELS[False][0](wte, wpe, tokens)]
    if kind == "scatter_add":
        dwte, dx = randn(rng, vocab, w), randn(rng, 2 * t_len, w)
        tokens = rng.integers(0, vocab // 2, 2 * t_len).astype(np.int32)  # repeated tokens: the order matters
        out = dwte.copy()
        embedding.KERNELS[False][1](out, dx, *embedding.positions_by_token(tokens, vocab))
        return [dwte, dx, tokens], {}, [out]
    if kind in ("split_heads", "merge_heads", "merge_qkv"):
        heads, hd = 3, 4
        attrs = {"seq_len": t_len, "n_heads": heads}
        split, merge, merge_qkv = attention.KERNELS[False][:3]
        if kind == "split_heads":
            x = randn(rng, 2 * t_len, 3 * heads * hd)
            attrs.update(col0=heads * hd, width=heads * hd)
            return [x], attrs, [split(x, heads * hd, heads * hd, t_len, heads)]
        parts = [randn(rng, 2 * heads, t_len, hd) for _ in range(3 if kind == "merge_qkv" else 1)]
        out = merge_qkv(*parts, t_len, heads) if kind == "merge_qkv" else merge(parts[0], t_len, heads)
        return parts, attrs, [out]
    if kind == "zeros":
        return [], {"rows": 5 * n, "cols": w}, [backend.cpu_backend(False).zeros((5 * n, w))]
    if kind in ("sumsq", "clip"):
        grads = [randn(rng, 3 * n, w, scale=0.3), randn(rng, w), randn(rng, 40 * n + 7, scale=0.1)]
        be = backend.cpu_backend(False)
        if kind == "sumsq":
            return grads[:1], {}, [np.array([be.sumsq(grads[0])], F)]
        sums = [np.array([be.sumsq(g)], F) for g in grads]
        return sums, {"max_norm_bits": bits(1.0)}, [be.clip_norm(grads, F(1.0))]
    if kind == "causal_softmax":
        s, scale_ = randn(rng, 3, t_len, t_len, scale=5.0), attention_scale(64)
        return [s], {"scale_bits": bits(scale_)}, [attention.KERNELS[False][3](s, scale_)]
    if kind == "cross_entropy":
        logits, targets = randn(rng, 6 * n, vocab, scale=4.0), rng.integers(0, vocab, 6 * n).astype(np.int32)
        inv_n = F(1) / F(240)
        total, dlogits = loss.KERNELS[False](logits, targets, inv_n)
        return [logits, targets], {"inv_n_bits": bits(inv_n)}, [np.array([total], F), dlogits]
    if kind == "matmul":
        return matmul_case((4 * n - 3, k), (k, w), False, False, matmul.DENSE, rng)
    raise AssertionError(kind)


def matmul_case(shape_a, shape_b, trans_a, trans_b, structure, rng):
    a, b = randn(rng, *shape_a), randn(rng, *shape_b)
    if structure in (matmul.A_LOWER, matmul.A_UPPER):  # the zeros the structure names are in op(a)
        lower = (structure == matmul.A_LOWER) != trans_a
        a = (np.tril(a) if lower else np.triu(a)).astype(F)
    a3, b3 = (x if x.ndim == 3 else x[None] for x in (a, b))
    out = matmul.MATMUL[False](a3, b3, trans_a, trans_b, structure)
    out = out if a.ndim == 3 else out[0]
    return [a, b], {"trans_a": int(trans_a), "trans_b": int(trans_b), "structure": structure}, [out]


def _raw(x: np.ndarray) -> bytes:
    return np.ascontiguousarray(x).astype(x.dtype.newbyteorder("<")).tobytes()


def traces_around(kind, inputs, attrs, outputs, signers, *, forge_output: int = 0, forge_element: int = 0,
                  state_inputs: frozenset = frozenset(), run=b"\x11" * 32, step=3, edit=None,
                  first_forges: int | None = None, pieces: type | None = None):
    """Two signed traces of a step in which op ``kind`` (last but one) reads ``inputs`` — from
    the state h_step where the index is in ``state_inputs``, else from a stand-in earlier op
    (kind ``source``: the referee never opens it) — and the fraud proof between them.
    ``signers[0]`` computed ``outputs``; ``signers[1]`` the same but element ``forge_element`` of
    output ``forge_output`` one ulp up; with ``first_forges``, ``signers[0]`` lies too, that element
    of the same output one ulp down. ``edit(record, party)``, if given, changes each party's op
    record before it is committed (a test's deliberately bad trace); the proof's chunks are still
    those of the unedited op. ``pieces``, if given, wraps each input's bytes as the proof's builder
    reads them (a :class:`open1b.protocol.dispute.trace.Pieces`, as a node's op data on disk)."""
    names = {i: f"h0.input{i}" for i in state_inputs}
    state = {names[i]: TensorBytes(str(inputs[i].dtype), inputs[i].shape, _raw(inputs[i])) for i in state_inputs}
    state["h0.other"] = TensorBytes("float32", (3,), _raw(np.arange(3, dtype=F)))
    prev, batch = blake2b256(b"prev"), blake2b256(b"batch")
    pre_state = state_hash(prev, step, state, batch, lr_bits=bits(6e-4))
    records, entries = [], []
    for i, x in enumerate(inputs):
        if i in state_inputs:
            entries.append({**tensor(str(x.dtype), x.shape, _raw(x), state=True), "state": names[i]})
        else:
            out = tensor(str(x.dtype), x.shape, _raw(x))
            records.append({"pos": len(records), "kind": "source", "attrs": {}, "inputs": [], "outputs": [out]})
            entries.append({**out, "op": len(records) - 1, "out": 0})
    forged = [o.copy() for o in outputs]
    flat = forged[forge_output].reshape(-1)
    flat[forge_element] = np.nextafter(flat[forge_element], F(np.inf))
    if first_forges is not None:
        outputs = [o.copy() for o in outputs]
        flat = outputs[forge_output].reshape(-1)
        flat[first_forges] = np.nextafter(flat[first_forges], F(-np.inf))
    pos = len(records)
    traces, trees, op_records, out_bytes, plain = [], [], [], [], []
    for party, (signer, outs) in enumerate(zip(signers, (outputs, forged))):
        record = {"pos": pos, "kind": kind, "attrs": dict(attrs), "inputs": entries,
                  "outputs": [tensor("float32", o.shape, _raw(o), state=state_output(kind)) for o in outs]}
        plain.append(record)
        record = record if edit is None else edit(record, party)
        tail = {"pos": pos + 1, "kind": "source", "attrs": {}, "inputs": [], "outputs": []}
        tree = trace_tree([*records, record, tail])
        traces.append(TraceCommitment.create(signer, run=run, step=step, pre_state=pre_state,
                                             post_state=blake2b256(tree.root), ops=pos + 2, root=tree.root))
        trees.append(tree)
        op_records.append(record)
        out_bytes.append(_raw(outs[forge_output]))
    given = [InputBytes(_raw(x) if pieces is None else pieces(_raw(x)), tensor_proof(prev, step, state, batch, names[i], lr_bits=bits(6e-4))
                        if i in state_inputs else None) for i, x in enumerate(inputs)]
    # the chunks are chosen from the records as the op really is; the proof carries the edited ones
    proof = make_fraud_proof(tuple(traces), tuple(trees), tuple(plain), given, tuple(out_bytes), forge_output)
    return dataclasses.replace(proof, records=tuple(op_records))
