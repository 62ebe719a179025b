"""The fraud proof: one op of one step, shown with everything needed to re-execute the part of it
two signed traces disagree on (docs/protocol.md §18.3). Canonical CBOR; nothing here needs numpy.

    {"kind": "fraud_proof", "v": 2,
     "traces":  [trace_a, trace_b],          encoded, signed TraceCommitments
     "position": pos,
     "records": [record_a, record_b],        op ``pos`` as each trace commits it (trace.py)
     "paths":   [path_a, path_b],            each record's leaf path in its trace tree
     "reads":   [[opening…] per input],      the input chunks the disputed element reads (reads.py)
     "state":   [tensor_proof | null per input],   for a state input: its tensor against pre_state
     "output": o, "chunk": c,                the disputed output and chunk
     "claimed": [opening_a, opening_b]}      chunk c of output o, as each party computed it
    opening = [chunk index, bytes, path]
            / [chunk index, [slice…], bytes, [cv…], path]   of a large input (reads.py, r27)

:class:`FraudProof` holds the decoded form; :func:`make_fraud_proof` builds one from two traces
that disagree at an op whose inputs they agree on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ..codec import decode, encode
from ..commitments import TensorProof
from ..errors import WrongTypeError
from ..merkle import MerkleTree
from ..messages import PROTOCOL_VERSION
from ..schema import Bytes, Enum, ListOf, UInt, check_map
from .ops import KINDS, WHOLE
from .reads import (
    SLICE_SIZE, SlicedOpening, check_sliced, disputed_element, element_reads, needed_chunks, plan, read_by_elements,
    sliced_opening,
)  # fmt: skip
from .trace import (
    MAX_TRACE_OPS, MAX_TRACE_SIZE, Pieces, TraceCommitment, chunk_count, chunk_reader, chunk_size, chunk_tree,
    state_output,
)  # fmt: skip

KIND = "fraud_proof"
MAX_FRAUD_PROOF_SIZE = 128 << 20
"""Bytes: the largest proof the referee reads. A proof carries the input chunks (or slices, r27)
the disputed element reads (§18.3); at gpt-1b the largest is 67.7 MB, a whole 64 MiB tensor."""
MAX_FRAUD_PROOF_ITEMS = 1 << 20
"""CBOR data items of a proof: a full-size proof holds ~8,000 chunks of ~20 items each (a gpt-1b
weight gradient's, 5,120 sliced openings: 172k), and a bound on items, not only bytes, keeps a
proof of tiny items from costing gigabytes to decode."""
MAX_OP_INPUTS = 128
"""Inputs of one op: `clip` reads one sum of squares per parameter (gpt-1b: 112)."""
MAX_OUTPUTS = 4
MAX_NDIM = 8
MAX_ATTRS = 16
MAX_PATH = 64
MAX_STATE_PATH = 32
_HASH = Bytes(size=32)
_PATH = ListOf(_HASH, MAX_PATH)
_DIM = UInt(maximum=(1 << 32) - 1)
_TENSOR = {"dtype": Enum(frozenset({"float32", "int32"})), "shape": ListOf(_DIM, MAX_NDIM), "root": _HASH}
_FROM_OP = {**_TENSOR, "op": UInt(maximum=MAX_TRACE_OPS), "out": UInt(maximum=MAX_OUTPUTS - 1)}
_TENSOR_PROOF = {"prev": _HASH, "step": UInt(), "lr_bits": UInt(maximum=(1 << 32) - 1), "batch_digest": _HASH,
                 "count": UInt(maximum=(1 << 32) - 1), "state_root": _HASH, "index": UInt(maximum=(1 << 32) - 1),
                 "path": ListOf(_HASH, MAX_STATE_PATH)}  # fmt: skip


@dataclass(frozen=True)
class Opening:
    """Chunk ``index`` of a tensor: its bytes and its path in the tensor's chunk tree."""

    index: int
    data: bytes
    path: tuple[bytes, ...]

    def to_cbor(self) -> list:
        return [self.index, self.data, list(self.path)]


@dataclass(frozen=True)
class FraudProof:
    traces: tuple[TraceCommitment, TraceCommitment]
    position: int
    records: tuple[dict, dict]
    paths: tuple[tuple[bytes, ...], tuple[bytes, ...]]
    reads: tuple[tuple[Opening | SlicedOpening, ...], ...]
    state: tuple[TensorProof | None, ...]
    output: int
    chunk: int
    claimed: tuple[Opening, Opening]

    def to_cbor(self) -> dict:
        return {
            "kind": KIND, "v": PROTOCOL_VERSION, "traces": [t.encoded for t in self.traces],
            "position": self.position, "records": [dict(r) for r in self.records], "paths": [list(p) for p in self.paths],
            "reads": [[o.to_cbor() for o in chunks] for chunks in self.reads],
            "state": [None if p is None else _tensor_proof_cbor(p) for p in self.state],
            "output": self.output, "chunk": self.chunk, "claimed": [o.to_cbor() for o in self.claimed],
        }  # fmt: skip

    def encode(self) -> bytes:
        return encode(self.to_cbor())

    @classmethod
    def decode(cls, data: bytes) -> "FraudProof":
        """Size, canonical CBOR, schema and both traces' signatures; raises a typed ProtocolError
        (its ``code`` is the rule's, docs/protocol.md §18.4). The op itself is judged by
        :func:`.referee.verify_fraud_proof`."""
        value = decode(data, max_size=MAX_FRAUD_PROOF_SIZE, max_items=MAX_FRAUD_PROOF_ITEMS)
        kind = value.get("kind") if type(value) is dict else None
        if kind != KIND:
            raise WrongTypeError(f"expected a {KIND}, got {kind!r}", code="kind")
        if value.get("v") != PROTOCOL_VERSION or type(value.get("v")) is not int:
            raise WrongTypeError(f"{KIND}: unsupported protocol version {value.get('v')!r}", code="version")
        check_map({"kind": Enum(frozenset({KIND})), "v": UInt(), "traces": _Pair(Bytes(max_size=MAX_TRACE_SIZE)),
                   "position": UInt(maximum=MAX_TRACE_OPS), "records": _Pair(_Any()), "paths": _Pair(_PATH),
                   "reads": ListOf(ListOf(_OPENING, 1 << 16), MAX_OP_INPUTS), "state": ListOf(_Any(), MAX_OP_INPUTS),
                   "output": UInt(maximum=MAX_OUTPUTS - 1), "chunk": UInt(maximum=(1 << 32) - 1),
                   "claimed": _Pair(_OPENING)}, value, KIND)  # fmt: skip
        records = tuple(check_record(r, i) for i, r in enumerate(value["records"]))
        state = tuple(None if p is None else _tensor_proof(p) for p in value["state"])
        if len(state) != len(value["reads"]):
            raise WrongTypeError(f"{KIND}: state and reads have different lengths")
        traces = tuple(TraceCommitment.decode(t) for t in value["traces"])
        return cls(traces, value["position"], records, tuple(tuple(p) for p in value["paths"]),  # type: ignore[arg-type]
                   tuple(tuple(_opening(o) for o in chunks) for chunks in value["reads"]), state, value["output"],
                   value["chunk"], tuple(_opening(o) for o in value["claimed"]))  # type: ignore[arg-type]


class _Any:
    """A field checked by the code that reads it (records, state proofs)."""

    def check(self, name: str, value: Any) -> None:
        pass


class _Opening:
    def check(self, name: str, value: Any) -> None:
        if type(value) is list and len(value) == 5:
            return check_sliced(name, value, _PATH)
        if type(value) is not list or len(value) != 3:
            raise WrongTypeError(f"{name}: expected [index, bytes, path] or [index, slices, bytes, cvs, path]")
        UInt(maximum=(1 << 32) - 1).check(name, value[0])
        Bytes(max_size=max(chunk_size(state=True), chunk_size(state=False))).check(name, value[1])
        _PATH.check(name, value[2])


_OPENING = _Opening()


@dataclass(frozen=True)
class _Pair:
    """Exactly two of ``item``: one per party, in the traces' order."""

    item: Any

    def check(self, name: str, value: Any) -> None:
        ListOf(self.item, 2).check(name, value)
        if len(value) != 2:
            raise WrongTypeError(f"{name}: expected two entries, one per party")


def _opening(value: list) -> Opening | SlicedOpening:
    return sliced_opening(value) if len(value) == 5 else Opening(value[0], value[1], tuple(value[2]))


def _check_tensor(value: Any, schema: dict, what: str) -> None:
    check_map(schema, value, what)
    if not value["shape"] or 0 in value["shape"]:
        raise WrongTypeError(f"{what}: a tensor has at least one dimension and no empty one")


def check_record(value: Any, party: int) -> dict:
    what = f"{KIND}.records[{party}]"
    check_map({"pos": UInt(maximum=MAX_TRACE_OPS), "kind": _Any(), "attrs": _Any(), "inputs": ListOf(_Any(), MAX_OP_INPUTS),
               "outputs": ListOf(_Any(), MAX_OUTPUTS)}, value, what)  # fmt: skip
    if type(value["kind"]) is not str or len(value["kind"]) > 32:
        raise WrongTypeError(f"{what}.kind: expected a short text")
    attrs = value["attrs"]
    if type(attrs) is not dict or len(attrs) > MAX_ATTRS:
        raise WrongTypeError(f"{what}.attrs: expected a map of at most {MAX_ATTRS} entries")
    for key, item in attrs.items():
        if type(key) is not str or len(key) > 32 or type(item) is not int or not 0 <= item < 1 << 32:
            raise WrongTypeError(f"{what}.attrs: names are short texts, values u32")
    for i, entry in enumerate(value["inputs"]):
        if type(entry) is dict and "state" in entry:
            _check_tensor(entry, {**_TENSOR, "state": _StateName()}, f"{what}.inputs[{i}]")
        else:
            _check_tensor(entry, _FROM_OP, f"{what}.inputs[{i}]")
    for i, entry in enumerate(value["outputs"]):
        _check_tensor(entry, _TENSOR, f"{what}.outputs[{i}]")
    return value


class _StateName:
    def check(self, name: str, value: Any) -> None:
        if type(value) is not str or not 0 < len(value.encode()) <= 256:
            raise WrongTypeError(f"{name}: expected a tensor name")


def _tensor_proof(value: Any) -> TensorProof:
    check_map(_TENSOR_PROOF, value, f"{KIND}.state")
    return TensorProof(value["prev"], value["step"], value["lr_bits"], value["batch_digest"], value["count"],
                       value["state_root"], value["index"], tuple(value["path"]))


def _tensor_proof_cbor(p: TensorProof) -> dict:
    return {"prev": p.prev, "step": p.step, "lr_bits": p.lr_bits, "batch_digest": p.batch_digest, "count": p.count,
            "state_root": p.state_root, "index": p.index, "path": list(p.path)}


# ---- building a proof (a party that found the op) ---------------------------------------------

@dataclass(frozen=True)
class InputBytes:
    """An input's raw bytes (or a reader of them, :class:`.trace.Pieces`) and, for a state input,
    its tensor proof against pre_state."""

    data: bytes | Pieces
    state_proof: TensorProof | None = None


def _openings(data: bytes | Pieces, indices: Sequence[int], *, state: bool) -> tuple[Opening, ...]:
    tree, size, (_, read) = chunk_tree(data, state=state), chunk_size(state=state), chunk_reader(data)
    return tuple(Opening(i, bytes(read(i * size, size)), tuple(tree.proof(i))) for i in indices)


def make_fraud_proof(traces: tuple[TraceCommitment, TraceCommitment], trees: tuple[MerkleTree, MerkleTree],
                     records: tuple[dict, dict], inputs: Sequence[InputBytes], outputs: tuple[bytes, bytes],
                     output: int | None = None) -> FraudProof:
    """The proof that op ``records[0]["pos"]`` is where the two traces part: ``trees`` are the
    trace trees, ``inputs`` the op's input bytes (the same for both: the op's inputs agree),
    ``outputs`` each party's bytes of output ``output`` (default: the first output whose roots
    differ). The proof names the first chunk of that output that differs."""
    pos = records[0]["pos"]
    if output is None:
        output = next(i for i, (a, b) in enumerate(zip(records[0]["outputs"], records[1]["outputs"])) if a != b)
    state = state_output(records[0]["kind"])
    size = chunk_size(state=state)
    chunk = next(i for i in range(chunk_count(len(outputs[0]), state=state))
                 if outputs[0][i * size:(i + 1) * size] != outputs[1][i * size:(i + 1) * size])
    claimed = (_openings(outputs[0], [chunk], state=state)[0], _openings(outputs[1], [chunk], state=state)[0])
    return fraud_proof_at(traces, (tuple(trees[0].proof(pos)), tuple(trees[1].proof(pos))), records, inputs, output,
                          claimed)


def fraud_proof_at(traces: tuple[TraceCommitment, TraceCommitment], paths: tuple[tuple[bytes, ...], ...],
                   records: tuple[dict, dict], inputs: Sequence[InputBytes], output: int,
                   claimed: tuple[Opening, Opening]) -> FraudProof:
    """The proof of :func:`make_fraud_proof` from what a bisection (:mod:`.bisection`) leaves a
    party: each record's ``paths`` in its trace, the op's ``inputs`` (its own), and each
    party's opening of the first chunk of output ``output`` at which they differ."""
    chunk = claimed[0].index
    shape = records[0]["outputs"][output]["shape"]
    element, row = disputed_element(shape, chunk, claimed[0].data, claimed[1].data,
                                    state=state_output(records[0]["kind"]))
    kind = KINDS.get(records[0]["kind"])  # a kind this version cannot re-execute: carry every chunk
    attrs = records[0]["attrs"]
    modes = kind.reads(output, attrs, len(inputs)) if kind else (WHOLE,) * len(inputs)
    reads = []
    for which, (entry, how, given) in enumerate(zip(records[0]["inputs"], modes, inputs)):
        if kind and read_by_elements(entry):
            runs = element_reads(kind.name, which, entry, how, attrs, shape, element)
            reads.append(_planned_openings(given.data, plan(entry, runs) or [], state="state" in entry))
        else:
            reads.append(_openings(given.data, needed_chunks(entry, how, row, attrs), state="state" in entry))
    return FraudProof(traces, records[0]["pos"], records, paths, tuple(reads),
                      tuple(given.state_proof for given in inputs), output, chunk, claimed)


def _planned_openings(data: bytes | Pieces, planned: list, *, state: bool) -> tuple[Opening | SlicedOpening, ...]:
    """The openings of ``planned`` (:func:`.reads.plan`): whole chunks, and slices with the CVs
    that prove them (:mod:`.blake3_tree`, numpy: a party building a proof has it)."""
    tree, size, (_, read) = chunk_tree(data, state=state), chunk_size(state=state), chunk_reader(data)
    sliced = [(c, s) for c, s in planned if s is not None]
    if sliced:
        from .blake3_tree import full_tree, gap_cvs

        trees = dict(zip((c for c, _ in sliced), full_tree([bytes(read(c * size, size)) for c, _ in sliced])))
    out: list[Opening | SlicedOpening] = []
    for c, slices in planned:
        if slices is None:
            out.append(Opening(c, bytes(read(c * size, size)), tuple(tree.proof(c))))
            continue
        parts = b"".join(read(c * size + s * SLICE_SIZE, SLICE_SIZE) for s in slices)
        out.append(SlicedOpening(c, slices, parts, gap_cvs(trees[c], slices), tuple(tree.proof(c))))
    return tuple(out)
