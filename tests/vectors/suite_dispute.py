"""``dispute`` vectors (docs/protocol.md §18): fraud proofs and the referee's verdict on each.

Case: ``{"description", "proof", "outcome", "code", "guilty", "op", "position"}`` — judging the
encoded ``proof`` (hex) gives ``outcome`` (``accept`` / ``reject`` / ``ignore``) with reason
``code``; an accepted proof names ``op`` at ``position`` and the ``guilty`` peer IDs. For every op
kind the referee re-executes: ``<kind>-true`` convicts the forger (the traces' second signer,
seed 2; the honest party is seed 1), ``<kind>-forged`` is the same proof with one input chunk
altered so that the re-execution would blame the honest party (for ``zeros``, which has no
inputs, the honest party's claimed chunk), which the referee must refuse.
The other cases break one rule each. Inputs are random normals (seeded), outputs are the
kernels', and a forged output is one ulp off in one element.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from open1b.protocol.dispute.ops import KINDS
from open1b.protocol.dispute.proof import Opening
from open1b.protocol.dispute.referee import verify_fraud_proof
from open1b.protocol.dispute.trace import TraceCommitment
from open1b.deterministic import activation, attention, loss, matmul, optimizer, reduction
from tests.protocol.dispute_cases import adamw_scalars, bits, kernel_case, traces_around

from .common import hx, ident, unhex

NAME = "dispute"
HONEST, FORGER = ident(1), ident(2)


def _proof(kind: str, seed: int, **kw):
    inputs, attrs, outputs = kernel_case(kind, np.random.default_rng(seed), "vector")
    return traces_around(kind, inputs, attrs, outputs, (HONEST, FORGER), **kw)


def _flip(o):
    return dataclasses.replace(o, data=bytes([o.data[0] ^ 0x01]) + o.data[1:])


def _with_first_read_flipped(proof):
    """One bit of the first input chunk flipped; an op without inputs (``zeros``) has the honest
    party's claimed chunk flipped instead."""
    if not proof.reads:
        return dataclasses.replace(proof, claimed=(_flip(proof.claimed[0]), proof.claimed[1]))
    return dataclasses.replace(proof, reads=((_flip(proof.reads[0][0]), *proof.reads[0][1:]), *proof.reads[1:]))


def _resigned(proof, index, signer, **changes):
    t = proof.traces[index]
    fields = {f.name: getattr(t, f.name) for f in dataclasses.fields(t) if f.name not in ("sig", "tracer")}
    traces = list(proof.traces)
    traces[index] = TraceCommitment.create(signer, **{**fields, **changes})
    return dataclasses.replace(proof, traces=tuple(traces))


def _case(description: str, proof) -> dict:
    data = proof.encode()
    verdict = verify_fraud_proof(data)
    return {"description": description, "proof": hx(data), "outcome": verdict.outcome.value, "code": verdict.code,
            "guilty": list(verdict.guilty_peers), "op": verdict.op, "position": verdict.position}  # fmt: skip


def cases() -> dict[str, dict]:
    out = {}
    for seed, kind in enumerate(sorted(KINDS)):
        last = len(KINDS[kind].outputs) - 1  # the last output: rstd, v, dlogits, …
        inputs, attrs, outputs = kernel_case(kind, np.random.default_rng(seed), "vector")
        element = min(3, outputs[last].size - 1)
        proof = traces_around(kind, inputs, attrs, outputs, (HONEST, FORGER), forge_output=last, forge_element=element)
        out[f"{kind}-true"] = _case(f"{kind}: the forger's output {last} is one ulp off in element {element}; the "
                                    "proof convicts it", proof)
        out[f"{kind}-forged"] = _case(f"{kind}: the true proof with one bit of an input chunk flipped (the "
                                      "re-execution would blame the honest party): refused", _with_first_read_flipped(proof))
    base = _proof("matmul", 100, forge_element=5)
    out["state-input"] = _case("adamw whose p, m and v are read from the state h_k, each proven against the traces' "
                               "pre_state", _proof("adamw", 101, forge_output=0, state_inputs=frozenset({0, 2, 3})))
    bad_state = _proof("adamw", 101, forge_output=0, state_inputs=frozenset({0, 2, 3}))
    bad_state = dataclasses.replace(bad_state, state=(dataclasses.replace(bad_state.state[0], step=4),
                                                      *bad_state.state[1:]))
    out["state-input-wrong-state"] = _case("a state input's tensor proof is for another state", bad_state)
    out["claimed-swapped"] = _case("the two claimed chunks swapped: neither opens its party's output",
                                   dataclasses.replace(base, claimed=base.claimed[::-1]))
    out["record-wrong-position"] = _case("the records proven at another position than they are",
                                         dataclasses.replace(base, position=base.position + 1))
    out["same-signer"] = _case("both traces signed by one key", _resigned(base, 1, HONEST))
    out["different-steps"] = _case("the traces are about different steps", _resigned(base, 1, FORGER, step=4))
    out["missing-chunk"] = _case("an input chunk the disputed row reads is left out",
                                 dataclasses.replace(base, reads=((), *base.reads[1:])))
    out["no-such-output"] = _case("the disputed output does not exist", dataclasses.replace(base, output=1))
    out["inputs-differ"] = _case("the records differ in an attribute: the traces part before this op's output",
                                 _proof("matmul", 102, edit=lambda r, party: {**r, "attrs": {**r["attrs"],
                                                                                             "trans_b": party}}))
    out["output-shape"] = _case("the forger's record has one output too many: convicted without a re-execution",
                                _proof("add", 103, edit=lambda r, party: {**r, "outputs": r["outputs"] * (party + 1)}))
    out["unsupported-op"] = _case("an op kind this referee does not re-execute: ignored",
                                  _proof("gelu", 104, edit=lambda r, party: {**r, "kind": "future_op"}))
    out["two-liars-first-element"] = _case(
        "both parties lie: seed 1 in element 9, seed 2 in element 4; the first element at which the chunks differ "
        "is 4, so only seed 2 is convicted", _proof("gelu", 105, forge_element=4, first_forges=9))
    out["two-liars-same-element"] = _case("both parties lie in element 4, in opposite directions: both are convicted",
                                          _proof("gelu", 106, forge_element=4, first_forges=4))
    dup = _proof("add", 107, forge_element=2)
    out["duplicate-chunk"] = _case("an input chunk given twice: the chunks are exactly those read, once each",
                                   dataclasses.replace(dup, reads=((dup.reads[0][0], *dup.reads[0]), *dup.reads[1:])))
    out["unknown-and-differing"] = _case(
        "the records differ in an attribute and name a kind this referee does not know: refused, because they part "
        "before the op (inputs_differ comes before unsupported_op)",
        _proof("gelu", 108, edit=lambda r, party: {**r, "kind": "future_op", "attrs": {"rows": party}}))
    out["same-root"] = _case("the forger signs a copy of the honest trace: one trace on both sides",
                             _resigned(dup, 1, FORGER, root=dup.traces[0].root, post_state=dup.traces[0].post_state))
    rng = np.random.default_rng(109)
    u = (rng.standard_normal((400, 50)) * 4).astype(np.float32)  # 80,000 bytes: two trace chunks
    out["rows-two-chunks"] = _case("gelu over two input chunks: the disputed row (in the second) reads only the "
                                   "second", traces_around("gelu", [u], {}, [activation.KERNELS[False][0](u)],
                                                           (HONEST, FORGER), forge_element=19900))
    logits = (rng.standard_normal((1200, 16)) * 4).astype(np.float32)  # two trace chunks
    targets = rng.integers(0, 16, 1200).astype(np.int32)
    inv_n = np.float32(1) / np.float32(1200)
    total, dlogits = loss.KERNELS[False](logits, targets, inv_n)
    out["cross_entropy-loss"] = _case(
        "the forger's loss is one ulp off: the loss reads every row, so every chunk of the logits and targets is "
        "carried", traces_around("cross_entropy", [logits, targets], {"inv_n_bits": bits(inv_n)},
                                 [np.array([total], np.float32), dlogits], (HONEST, FORGER), forge_output=0))
    x = (rng.standard_normal((256, 96))).astype(np.float32)  # 98,304 bytes: two trace chunks
    split = attention.KERNELS[False][0](x, 32, 32, 16, 2)
    out["split-heads-two-chunks"] = _case(
        "split_heads (T 16, 2 heads of 16) of columns 32-63: output row (b·H + h)·T + t = 412 (b 12, h 1, t 12) is "
        "a piece of input row b·T + t = 204, in the second chunk only",
        traces_around("split_heads", [x], {"col0": 32, "width": 32, "seq_len": 16, "n_heads": 2}, [split],
                      (HONEST, FORGER), forge_element=412 * 16 + 3))
    p, g, m = (rng.standard_normal((165, 100)).astype(np.float32) for _ in range(3))  # 66,000 bytes each
    v = np.abs(rng.standard_normal((165, 100)) * 0.01).astype(np.float32)
    s = adamw_scalars()
    update = traces_around("adamw", [p, g, m, v], dict(zip(KINDS["adamw"].attrs, map(bits, s.args()))),
                           list(optimizer.KERNELS[False](p, g, m, v, *s.args())), (HONEST, FORGER),
                           forge_element=16450)
    out["update-trace-chunk"] = _case(
        "adamw's output p (66,000 bytes) is one state-tree chunk (§18.1: the update's outputs are chunked as the "
        "state is), so its element 16,450 is in chunk 0; this proof names it chunk 1 as if the output were cut "
        "into 64 KiB trace chunks: no such chunk",
        dataclasses.replace(update, chunk=1, claimed=tuple(dataclasses.replace(o, index=1) for o in update.claimed)))
    out.update(_sliced_cases(rng))
    return out


def _sliced_cases(rng) -> dict[str, dict]:
    """r27: inputs over SLICED_INPUT_BYTES, read by the elements the disputed element reads. The
    disputed elements lie in the outputs' short last chunks, so the claimed chunks are small."""
    out = {}
    a = rng.standard_normal((40, 52500)).astype(np.float32)  # 8.4 MB: a column of it is 40 slices
    b = rng.standard_normal((40, 1)).astype(np.float32)
    prod = matmul.MATMUL[False](a[None], b[None], True, False, 0)[0]
    true = traces_around("matmul", [a, b], {"trans_a": 1, "trans_b": 0, "structure": 0}, [prod], (HONEST, FORGER),
                         forge_element=52000)
    out["matmul-sliced-true"] = _case(
        "a weight gradient aᵀ @ b with a (40 × 52,500) over SLICED_INPUT_BYTES: element 52,000 reads column 52,000 "
        "of a, one 1 KiB slice of each of 40 trace chunks with the CVs of its gaps; the proof convicts the forger",
        true)
    out["matmul-sliced-forged"] = _case("the same proof with one bit of the first slice flipped: refused",
                                        _with_first_read_flipped(true))
    first = true.reads[0][0]
    whole = Opening(first.index, a.tobytes()[first.index * 65536:(first.index + 1) * 65536], first.path)
    out["sliced-old-style-whole-chunk"] = _case(
        "the same proof with the first chunk carried whole, as before r27: not the opening the reads name",
        dataclasses.replace(true, reads=((whole, *true.reads[0][1:]), *true.reads[1:])))
    bad_cv = dataclasses.replace(first, cvs=(first.cvs[0][:31] + bytes([first.cvs[0][31] ^ 1]), *first.cvs[1:]))
    out["sliced-wrong-cv"] = _case("the same proof with one bit of a gap's CV flipped: the slice does not open a's root",
                                   dataclasses.replace(true, reads=((bad_cv, *true.reads[0][1:]), *true.reads[1:])))
    x = rng.standard_normal((8, 262200)).astype(np.float32)  # 8.4 MB: a column of it is 8 elements
    sums = reduction.KERNELS[False][0](x)
    true = traces_around("sum_rows", [x], {}, [sums], (HONEST, FORGER), forge_element=262190)
    out["sum_rows-sliced-true"] = _case(
        "sum_rows over x (8 × 262,200) over SLICED_INPUT_BYTES: element 262,190 reads column 262,190, one slice per "
        "row (the last in x's short last chunk, whole); the proof convicts the forger", true)
    out["sum_rows-sliced-forged"] = _case("the same proof with one bit of the first slice flipped: refused",
                                          _with_first_read_flipped(true))
    return out


def check(case: dict, root: Path) -> None:
    verdict = verify_fraud_proof(unhex(case["proof"]))
    assert (verdict.outcome.value, verdict.code) == (case["outcome"], case["code"])
    assert list(verdict.guilty_peers) == case["guilty"]
    assert (verdict.op, verdict.position) == (case["op"], case["position"])
