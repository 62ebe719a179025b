"""The referee: judge a fraud proof offline (docs/protocol.md §18.4).

:func:`verify_fraud_proof` applies the rules below in order, each a ``[REJECT]`` (the proof is
invalid: whoever sent it is penalised) or ``[IGNORE]`` (this referee cannot judge it) above the
check that enforces it, then re-executes the row of the op's output that holds the first element at which the two claimed
chunks differ (:mod:`.reference`, numpy) and names the party, or parties, whose value of that
element differs from the re-execution. Everything
up to the re-execution needs only the base install; numpy is imported when the op is re-executed,
so ``import open1b.protocol`` never loads it (``pip install 'open1b[referee]'`` brings it).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..commitments import verify_tensor_root
from ..errors import InvalidStatementError, Outcome, ProtocolError, UnjudgeableError
from ..identity import peer_id_from_public_key
from ..merkle import MerkleTree, verify_merkle_proof
from .ops import KINDS, output_shapes, rows_of
from .proof import FraudProof, Opening
from .reads import SLICE_SIZE, SlicedOpening, disputed_element, element_reads, needed_chunks, plan, read_by_elements
from .trace import chunk_count, chunk_digest, chunk_size, nbytes, op_leaf, state_output


MAX_OP_TENSOR_BYTES = 1 << 33
"""Bytes of any input or output of a judged op (8 GiB; gpt-1b's largest activation is 1 GiB)."""


@dataclass(frozen=True)
class FraudVerdict:
    """What a fraud proof shows. ``outcome`` is ACCEPT when the proof is valid: ``guilty`` then
    holds the public key of each party whose output the re-execution contradicts (one, or both
    when both lied). Otherwise ``code`` is the rule the proof broke (REJECT) or could not be judged
    by (IGNORE), and ``guilty`` is empty."""

    outcome: Outcome
    code: str
    reason: str
    guilty: tuple[bytes, ...] = ()
    op: str | None = None
    position: int | None = None
    run: bytes | None = None
    step: int | None = None

    @property
    def accepted(self) -> bool:
        return self.outcome is Outcome.ACCEPT

    @property
    def guilty_peers(self) -> tuple[str, ...]:
        return tuple(peer_id_from_public_key(k) for k in self.guilty)

    def to_json(self) -> dict:
        return {"outcome": self.outcome.value, "code": self.code, "reason": self.reason, "op": self.op,
                "position": self.position, "run": None if self.run is None else self.run.hex(), "step": self.step,
                "guilty": list(self.guilty_peers)}  # fmt: skip


def _reject(message: str, code: str) -> InvalidStatementError:
    return InvalidStatementError(message, code=code)


def _opens(opening, root: bytes, total: int, *, state: bool) -> bool:
    """The opening is chunk ``opening.index`` of a ``total``-byte tensor with chunk-tree ``root``."""
    count, size = chunk_count(total, state=state), chunk_size(state=state)
    if not 0 <= opening.index < count or len(opening.data) != min(size, total - opening.index * size):
        return False
    return verify_merkle_proof(chunk_digest(opening.index, opening.data, state=state), opening.index, count,
                               opening.path, root)


def _all_open(openings, root: bytes, total: int, *, state: bool) -> bool:
    """Each opening opens ``root`` (:func:`_opens`). When they are every chunk of the tensor in
    order (an input read whole), one tree over their digests gives the same answer for a fraction
    of the hashing: a path of leaf i is valid iff it is the tree's path of i (its root is ``root``)."""
    count = chunk_count(total, state=state)
    if count < 2 or [o.index for o in openings] != list(range(count)):
        return all(_opens(o, root, total, state=state) for o in openings)
    size = chunk_size(state=state)
    if any(len(o.data) != min(size, total - o.index * size) for o in openings):
        return False
    tree = MerkleTree([chunk_digest(o.index, o.data, state=state) for o in openings])
    return tree.root == root and all(list(o.path) == tree.proof(o.index) for o in openings)


def _slices_open(openings, root: bytes, total: int) -> bool:
    """Each sliced opening, with its CVs, implies a chunk digest (BLAKE3's tree, §18.3) that opens
    ``root`` at its index."""
    from .blake3_tree import gaps, sliced_digests  # numpy: the referee extra's

    if not openings:
        return True
    if any(len(o.cvs) != len(gaps(o.slices)) for o in openings):
        return False
    count = chunk_count(total, state=False)
    return all(verify_merkle_proof(d, o.index, count, o.path, root)
               for d, o in zip(sliced_digests(openings), openings))


def _judge(proof: FraudProof) -> FraudVerdict:
    a, b = proof.traces
    rec_a, rec_b = proof.records
    # [REJECT] the traces are two parties' commitments to the same step from the same state
    if (a.run, a.step, a.pre_state, a.ops) != (b.run, b.step, b.pre_state, b.ops):
        raise _reject("the traces are not about the same step from the same state", "traces_differ")
    # [REJECT] the parties are distinct and their traces differ
    if a.tracer == b.tracer or a.root == b.root:
        raise _reject("one party, or one trace, on both sides", "same_trace")
    # [REJECT] each record is op `position` of its party's trace
    for trace, record, path in zip(proof.traces, proof.records, proof.paths):
        if record["pos"] != proof.position or not verify_merkle_proof(op_leaf(record), proof.position, trace.ops,
                                                                      path, trace.root):
            raise _reject("a record is not op `position` of its trace", "record_path")
    # [REJECT] both records are the same op on the same inputs (otherwise they part earlier)
    if (rec_a["kind"], rec_a["attrs"], rec_a["inputs"]) != (rec_b["kind"], rec_b["attrs"], rec_b["inputs"]):
        raise _reject("the records differ in kind, attributes or inputs", "inputs_differ")
    # [IGNORE] the op kind is one this referee re-executes
    kind = KINDS.get(rec_a["kind"])
    if kind is None:
        raise UnjudgeableError(f"op kind {rec_a['kind']!r} is not one the referee re-executes", code="unsupported_op")
    # [REJECT] the attributes and inputs are those of the kind, and the input shapes fit it
    attrs, inputs = rec_a["attrs"], rec_a["inputs"]
    if sorted(attrs) != sorted(kind.attrs) or [e["dtype"] for e in inputs] != kind.dtypes(len(inputs)):
        raise _reject(f"attributes or operands are not those of {kind.name}", "op_schema")
    try:
        want_shapes = output_shapes(kind.name, attrs, [tuple(e["shape"]) for e in inputs])
    except ValueError as exc:
        raise _reject(str(exc), "op_schema") from exc
    # [REJECT] every input read from an op is an output of an earlier op, and no tensor is larger
    # than MAX_OP_TENSOR_BYTES (the referee sizes its arrays from the shapes before reading a chunk)
    if any("op" in e and e["op"] >= proof.position for e in inputs):
        raise _reject("an input comes from a later op", "op_schema")
    if any(nbytes(e["dtype"], e["shape"]) > MAX_OP_TENSOR_BYTES for e in inputs) or \
            any(nbytes("float32", s) > MAX_OP_TENSOR_BYTES for s in want_shapes):
        raise _reject(f"a tensor larger than {MAX_OP_TENSOR_BYTES} bytes", "op_schema")
    context = dict(op=kind.name, position=proof.position, run=a.run, step=a.step)
    want = [{"dtype": "float32", "shape": list(s)} for s in want_shapes]
    # A party whose record has outputs of the wrong number or shapes is wrong without a re-execution.
    misshapen = tuple(t.tracer for t, r in zip(proof.traces, proof.records)
                      if [{"dtype": o["dtype"], "shape": o["shape"]} for o in r["outputs"]] != want)
    if misshapen:
        return FraudVerdict(Outcome.ACCEPT, "output_shape", "outputs not of the op's shapes", misshapen, **context)
    # [REJECT] the disputed output and chunk exist, and the two parties' roots of it differ
    if proof.output >= len(want_shapes):
        raise _reject("no such output", "output")
    total = nbytes("float32", want_shapes[proof.output])
    out_state = state_output(kind.name)  # the update's outputs are chunked as the state tree is (§18.1)
    root_a, root_b = (r["outputs"][proof.output]["root"] for r in proof.records)
    if root_a == root_b or not proof.chunk < chunk_count(total, state=out_state):
        raise _reject("the parties agree on that output, or the chunk does not exist", "output")
    # [REJECT] each claimed chunk is chunk `chunk` of its party's output, and they differ
    for opening, root in zip(proof.claimed, (root_a, root_b)):
        if opening.index != proof.chunk or not _opens(opening, root, total, state=out_state):
            raise _reject("a claimed chunk does not open its party's output", "claimed_chunk")
    if proof.claimed[0].data == proof.claimed[1].data:
        raise _reject("the claimed chunks are equal", "claimed_chunk")
    # [REJECT] exactly the input chunks the disputed row reads (of an input over SLICED_INPUT_BYTES,
    # the chunks or slices holding the elements the disputed element reads), each opening its
    # input's root (a state input's root proven against pre_state, h_step)
    element, row = disputed_element(want_shapes[proof.output], proof.chunk, proof.claimed[0].data,
                                    proof.claimed[1].data, state=out_state)
    if len(proof.reads) != len(inputs):
        raise _reject("one list of chunks per input", "reads")
    modes = kind.reads(proof.output, attrs, len(inputs))
    for which, (entry, how, openings, state_proof) in enumerate(zip(inputs, modes, proof.reads, proof.state)):
        state = "state" in entry
        size = nbytes(entry["dtype"], entry["shape"])
        given = [(o.index, o.slices if type(o) is SlicedOpening else None) for o in openings]
        if read_by_elements(entry):
            want = plan(entry, element_reads(kind.name, which, entry, how, attrs, want_shapes[proof.output], element),
                        limit=len(openings))
        else:
            want = [(c, None) for c in needed_chunks(entry, how, row, attrs)]
        if given != want:
            raise _reject("input chunks other than those the disputed element reads", "reads")
        whole = [o for o in openings if type(o) is Opening]
        if not _all_open(whole, entry["root"], size, state=state) or \
                not _slices_open([o for o in openings if type(o) is SlicedOpening], entry["root"], size):
            raise _reject("an input chunk does not open its input's root", "reads")
        if state != (state_proof is not None) or (state and not verify_tensor_root(
                entry["state"], entry["dtype"], entry["shape"], entry["root"], state_proof, a.pre_state)):
            raise _reject("a state input is not proven against pre_state", "state_input")
    wrong = _recompute(proof, kind.name, attrs, inputs, want_shapes, element, row)
    return FraudVerdict(Outcome.ACCEPT, "guilty", "re-execution contradicts " + (
        "both parties" if len(wrong) == 2 else "one party"), wrong, **context)


def _recompute(proof: FraudProof, kind: str, attrs: dict, inputs: list, want_shapes: list, element: int, row: int):
    import numpy as np  # the referee extra: only the re-execution needs it

    from .reference import compute_rows, matmul_element

    arrays = []
    for entry, openings in zip(inputs, proof.reads):
        # Zeros where no chunk was given: the disputed row never reads there (§18.2; the reference's
        # tests poison those parts with NaN), and calloc'd pages nobody touches cost no memory.
        flat = np.zeros(nbytes(entry["dtype"], entry["shape"]) // 4, np.dtype(entry["dtype"]).newbyteorder("<"))
        raw, size = flat.view(np.uint8), chunk_size(state="state" in entry)
        for o in openings:
            if type(o) is SlicedOpening:
                for k, s in enumerate(o.slices):
                    at = o.index * size + s * SLICE_SIZE
                    raw[at:at + SLICE_SIZE] = np.frombuffer(o.data, np.uint8, SLICE_SIZE, k * SLICE_SIZE)
            else:
                raw[o.index * size:o.index * size + len(o.data)] = np.frombuffer(o.data, np.uint8)
        arrays.append(flat.reshape(entry["shape"]))
    if kind == "cross_entropy":
        # [REJECT] the targets index the logits' columns (the agreed batch could not hold others)
        targets = arrays[1]
        if targets.min() < 0 or targets.max() >= arrays[0].shape[1]:
            raise _reject("a target outside the vocabulary", "bad_input")
    _, width = rows_of(tuple(want_shapes[proof.output]))
    if kind == "matmul":  # the disputed element alone: a product's columns are independent folds
        value = np.float32(matmul_element(arrays, attrs, row, element - row * width))
    else:
        value = compute_rows(kind, arrays, attrs, proof.output, row, row + 1)[element - row * width]
    at = (element - proof.chunk * (chunk_size(state=state_output(kind)) // 4)) * 4
    expected = value.astype("<f4").tobytes()
    return tuple(t.tracer for t, o in zip(proof.traces, proof.claimed) if o.data[at:at + 4] != expected)


def verify_fraud_proof(data: bytes) -> FraudVerdict:
    """Judge the encoded fraud proof ``data`` (module doc; rules in docs/protocol.md §18.4)."""
    try:
        # [REJECT] size, canonical CBOR, schema, and both traces' signatures (FraudProof.decode)
        proof = FraudProof.decode(data)
        return _judge(proof)
    except ProtocolError as exc:
        return FraudVerdict(exc.outcome, exc.code, f"{type(exc).__name__}: {exc}")
