"""A second reading of docs/protocol.md §18.1–§18.4 (fraud proofs and the referee), written from
the text: the structure of a proof, its paths, the reads table, and the order of the rules.

It takes the codec, Ed25519 and peer IDs from ``reference.py`` (the second reading of §3–§5) and
imports one thing from ``open1b``: the re-execution of a row of §18.2's op kinds
(``open1b.protocol.dispute.reference.compute_rows``), which the text defines by the kernels'
docstrings and which tests/protocol/test_dispute_reference.py checks bit for bit against them.
``referee_mutants.py`` rewrites the rule lines below into wrong readings; the ``dispute`` vectors
must reject every one (``test_referee_mutation.py``). One rule per line or block, as in
``reference.py``.
"""

from __future__ import annotations

import struct

import blake3

from . import reference as spec
from .blake3_reading import sliced_digest
from .reference import CONST, Refused, b2, decode, ed25519_valid, encode, peer_id

TRACE_CHUNK = CONST["TRACE_CHUNK_SIZE"]
STATE_CHUNK = 1 << 20  # docs/run-format.md §3.2
KINDS = {  # §18.2: inputs' dtypes, outputs, attrs
    "add": (("float32", "float32"), 1, ()), "plus_zero": (("float32",), 1, ()), "gelu": (("float32",), 1, ()),
    "gelu_backward": (("float32", "float32"), 1, ()),
    "adamw": (("float32",) * 4, 3, tuple(f"{n}_bits" for n in ("beta1", "one_minus_beta1", "beta2",
                                                              "one_minus_beta2", "decay", "step_size", "sqrt_bias2",
                                                              "eps", "coef"))),
    "rmsnorm": (("float32", "float32"), 2, ("eps_bits",)), "causal_softmax": (("float32",), 1, ("scale_bits",)),
    "rmsnorm_backward": (("float32",) * 5, 2, ()), "causal_softmax_backward": (("float32",) * 2, 1, ("scale_bits",)),
    "sum_rows": (("float32",), 1, ()), "embed": (("float32", "float32", "int32"), 1, ()),
    "scatter_add": (("float32", "float32", "int32"), 1, ()),
    "split_heads": (("float32",), 1, ("col0", "width", "seq_len", "n_heads")),
    "merge_heads": (("float32",), 1, ("seq_len", "n_heads")),
    "merge_qkv": (("float32",) * 3, 1, ("seq_len", "n_heads")),
    "sumsq": (("float32",), 1, ()), "clip": (None, 1, ("max_norm_bits",)),  # clip: any number of float32 inputs
    "zeros": ((), 1, ("rows", "cols")),
    "matmul": (("float32", "float32"), 1, ("trans_a", "trans_b", "structure")),
    "cross_entropy": (("float32", "int32"), 2, ("inv_n_bits",)),
}


def rows(shape) -> tuple[int, int]:
    if len(shape) == 1:
        return shape[0], 1
    n = 1
    for d in shape[:-1]:
        n *= d
    return n, shape[-1]


def reads_whole(kind: str, attrs: dict, output: int, i: int) -> bool:
    """§18.2's last column: does an output row read all of input i?"""
    if kind in ("rmsnorm", "rmsnorm_backward"):
        return i == 1
    if kind in ("sum_rows", "embed", "scatter_add"):
        return kind == "sum_rows" or (i < 2 if kind == "embed" else i > 0)
    if kind in ("sumsq", "clip"):
        return True
    if kind == "matmul":
        return i == 1 or attrs["trans_a"] == 1
    if kind == "cross_entropy":
        return output == 0
    return False


def read_rows(kind: str, attrs: dict, row: int) -> list[int]:
    """§18.2: the input rows output row ``row`` reads, for an input not read whole."""
    if kind == "split_heads":  # output row (b·H + h)·T + t is a piece of input row b·T + t
        return [row // attrs["seq_len"] // attrs["n_heads"] * attrs["seq_len"] + row % attrs["seq_len"]]
    if kind in ("merge_heads", "merge_qkv"):  # output row b·T + t gathers row (b·H + h)·T + t per head
        b, t = divmod(row, attrs["seq_len"])
        return [(b * attrs["n_heads"] + h) * attrs["seq_len"] + t for h in range(attrs["n_heads"])]
    return [row]


def read_elements(kind: str, attrs: dict, i: int, shape, o: int, out_shape, element: int, row: int) -> list:
    """§18.2's element reads (r27): [start, stop) ranges of input i's flat elements."""
    n, w = rows(shape)
    if kind == "matmul":  # row i of op(a), column j of op(b), in the element's batch
        s3, o3 = (list(x) if len(x) == 3 else [1, *x] for x in (shape, out_shape))
        base, at = row // o3[1] * s3[1] * s3[2], (row % o3[1] if i == 0 else element % o3[2])
        if (attrs["trans_a"] == 1) if i == 0 else (attrs["trans_b"] == 0):  # a column of the stored operand
            return [(base + k * s3[2] + at, base + k * s3[2] + at + 1) for k in range(s3[1])]
        return [(base + at * s3[2], base + (at + 1) * s3[2])]
    if kind == "sum_rows":
        return [(k * w + element, k * w + element + 1) for k in range(n)]
    if reads_whole(kind, attrs, o, i):
        return [(0, n * w)]
    return [(r * w, (r + 1) * w) for r in read_rows(kind, attrs, row)]


def planned(ranges: list, total: int, state: bool) -> list:
    """§18.3: (chunk, its slices or None for whole) per chunk holding an element of ``ranges``."""
    if state:
        return [(c, None) for c in sorted({c for s, t in ranges for c in range(s * 4 // STATE_CHUNK,
                                                                               -(-t * 4 // STATE_CHUNK))})]
    touched = {}
    for s, t in ranges:
        for sl in range(s * 4 // 1024, -(-t * 4 // 1024)):
            touched.setdefault(sl // 64, set()).add(sl % 64)
    full = total // TRACE_CHUNK
    return [(c, None if c >= full or len(v) == 64 else sorted(v)) for c, v in sorted(touched.items())]


def out_shapes(kind: str, attrs: dict, shapes: list) -> list:
    if kind in ("add", "gelu_backward", "adamw") and any(s != shapes[0] for s in shapes):
        raise Refused("op_schema")
    if kind == "rmsnorm":
        if len(shapes[0]) != 2 or shapes[1] != [shapes[0][1]]:
            raise Refused("op_schema")
        return [shapes[0], shapes[0][:1]]
    if kind in ("causal_softmax", "causal_softmax_backward") and (
            len(shapes[0]) != 3 or shapes[0][1] != shapes[0][2] or shapes[-1] != shapes[0]):
        raise Refused("op_schema")
    if kind == "rmsnorm_backward":
        x, g, r, dy, dres = shapes
        if len(x) != 2 or g != x[1:] or r != x[:1] or not x == dy == dres:
            raise Refused("op_schema")
        return [x, x]
    if kind == "sum_rows":
        if len(shapes[0]) != 2:
            raise Refused("op_schema")
        return [shapes[0][1:]]
    if kind == "zeros":
        return [[attrs["rows"], attrs["cols"]]]
    if kind == "sumsq":
        return [[1]]
    if kind == "clip":
        if any(s != [1] for s in shapes):
            raise Refused("op_schema")
        return [[2]]
    if kind == "scatter_add":
        dwte, dx, tokens = shapes
        if len(dwte) != 2 or len(dx) != 2 or dx[1] != dwte[1] or tokens != dx[:1]:
            raise Refused("op_schema")
        return [dwte]
    if kind == "split_heads":
        t, h, c0, w = attrs["seq_len"], attrs["n_heads"], attrs["col0"], attrs["width"]
        x = shapes[0]
        if len(x) != 2 or not t or not h or x[0] % t or w % h or c0 + w > x[1]:
            raise Refused("op_schema")
        return [[x[0] // t * h, t, w // h]]
    if kind in ("merge_heads", "merge_qkv"):
        o, t, h = shapes[0], attrs["seq_len"], attrs["n_heads"]
        if any(s != o for s in shapes) or len(o) != 3 or not h or o[0] % h or o[1] != t:
            raise Refused("op_schema")
        return [[o[0] // h * t, len(shapes) * h * o[2]]]
    if kind == "embed":
        wte, wpe, tokens = shapes
        if len(wte) != 2 or len(wpe) != 2 or wpe[1] != wte[1] or len(tokens) != 1 or tokens[0] % wpe[0]:
            raise Refused("op_schema")
        return [[tokens[0], wte[1]]]
    if kind == "matmul":
        a, b = shapes
        if len(a) != len(b) or len(a) not in (2, 3) or attrs["trans_a"] > 1 or attrs["trans_b"] > 1 or \
                attrs["structure"] > 3:
            raise Refused("op_schema")
        a3, b3 = (s if len(s) == 3 else [1, *s] for s in (a, b))
        m, k = (a3[2], a3[1]) if attrs["trans_a"] else (a3[1], a3[2])
        k2, n = (b3[2], b3[1]) if attrs["trans_b"] else (b3[1], b3[2])
        if a3[0] != b3[0] or k != k2:
            raise Refused("op_schema")
        return [[a3[0], m, n] if len(a) == 3 else [m, n]]
    if kind == "cross_entropy":
        if len(shapes[0]) != 2 or shapes[1] != shapes[0][:1]:
            raise Refused("op_schema")
        return [[1], shapes[0]]
    return [shapes[0]] * KINDS[kind][1]


def size(dtype: str, shape) -> int:
    n = 4
    for d in shape:
        n *= d
    return n


def path_ok(leaf: bytes, index: int, count: int, path: list, root: bytes) -> bool:
    """§6.2: RFC 9162 §2.1.3.2 over leaf hash B2(0x00 ‖ leaf)."""
    if not 0 <= index < count:
        return False
    fn, sn, r = index, count - 1, b2(b"\0", leaf)
    for p in path:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = b2(b"\1", p, r)
            while not fn & 1 and fn != 0:
                fn, sn = fn >> 1, sn >> 1
        else:
            r = b2(b"\1", r, p)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and r == root


def opens(opening: list, root: bytes, total: int, state: bool) -> bool:
    chunk = STATE_CHUNK if state else TRACE_CHUNK
    count = max(1, -(-total // chunk))
    i, data, path = opening
    if not 0 <= i < count or len(data) != min(chunk, total - i * chunk):
        return False
    if state:
        digest = b2(b"open1b/chunk/v2\0", struct.pack("<Q", i), data)
    else:
        digest = blake3.blake3(data + struct.pack("<Q", i), derive_key_context="open1b/trace/chunk/v2").digest()
    return path_ok(digest, i, count, path, root)


def sliced_opens(opening: list, root: bytes, total: int) -> bool:
    """§18.3: a sliced opening's slices and gap CVs imply a chunk digest that opens ``root``."""
    c, slices, data, cvs, path = opening
    if len(data) != 1024 * len(slices):
        return False
    digest = sliced_digest(c, slices, data, cvs)
    return digest is not None and path_ok(digest, c, max(1, -(-total // TRACE_CHUNK)), path, root)


def trace(data: bytes) -> dict:
    t = decode(data, CONST["MAX_TRACE_SIZE"])
    if type(t) is not dict or t.get("kind") != "trace" or t.get("v") != CONST["PROTOCOL_VERSION"]:
        raise Refused("kind")
    if set(t) != {"kind", "v", "run", "step", "pre_state", "post_state", "ops", "root", "tracer", "sig"}:
        raise Refused("unknown_field")
    body = {k: v for k, v in t.items() if k != "sig"}
    if not ed25519_valid(t["tracer"], spec.signing_bytes("trace", body), t["sig"]):
        raise Refused("bad_signature")
    return t


def state_proven(entry: dict, p: dict, h: bytes) -> bool:
    """run-format §3.4 for a tensor given by (name, dtype, shape, root)."""
    name = entry["state"].encode()
    digest = b2(b"open1b/tensor/v2\0", struct.pack("<H", len(name)), name, bytes([len(entry["dtype"])]),
                entry["dtype"].encode(), bytes([len(entry["shape"])]), *(struct.pack("<Q", d) for d in entry["shape"]),
                struct.pack("<Q", size(entry["dtype"], entry["shape"])), entry["root"])
    pre = b2(b"open1b/state/v2\0", p["prev"], struct.pack("<QI", p["step"], p["lr_bits"]), p["batch_digest"],
             struct.pack("<I", p["count"]), p["state_root"])
    return pre == h and path_ok(digest, p["index"], p["count"], p["path"], p["state_root"])


def judge(data: bytes) -> tuple[str, str, list[str]]:
    """(outcome, code, guilty peer IDs) of the encoded proof ``data``."""
    try:
        return _judge(data)
    except Refused as exc:
        return exc.outcome, exc.code, []


def _judge(data: bytes):
    p = decode(data, CONST["MAX_FRAUD_PROOF_SIZE"])
    if type(p) is not dict or p.get("kind") != "fraud_proof":
        raise Refused("kind")
    a, b = (trace(t) for t in p["traces"])
    ra, rb = p["records"]
    pos = p["position"]
    if (a["run"], a["step"], a["pre_state"], a["ops"]) != (b["run"], b["step"], b["pre_state"], b["ops"]):
        raise Refused("traces_differ")
    if a["tracer"] == b["tracer"] or a["root"] == b["root"]:
        raise Refused("same_trace")
    for t, r, path in zip((a, b), (ra, rb), p["paths"]):
        if r["pos"] != pos or not path_ok(b2(b"open1b/trace/op/v1\0", encode(r)), pos, t["ops"], path, t["root"]):
            raise Refused("record_path")
    if (ra["kind"], ra["attrs"], ra["inputs"]) != (rb["kind"], rb["attrs"], rb["inputs"]):
        raise Refused("inputs_differ")
    if ra["kind"] not in KINDS:
        raise Refused("unsupported_op", "ignore")
    dtypes, _, attr_names = KINDS[ra["kind"]]
    inputs, attrs = ra["inputs"], ra["attrs"]
    dtypes = ("float32",) * max(1, len(inputs)) if dtypes is None else dtypes
    if sorted(attrs) != sorted(attr_names) or tuple(e["dtype"] for e in inputs) != dtypes:
        raise Refused("op_schema")
    want = out_shapes(ra["kind"], attrs, [e["shape"] for e in inputs])
    if any("op" in e and e["op"] >= pos for e in inputs):
        raise Refused("op_schema")
    bad = [t["tracer"] for t, r in zip((a, b), (ra, rb))
           if [(o["dtype"], o["shape"]) for o in r["outputs"]] != [("float32", s) for s in want]]
    if bad:
        return "accept", "output_shape", [peer_id(k) for k in bad]
    o, c = p["output"], p["chunk"]
    out_state = ra["kind"] == "adamw"  # §18.1: the update's outputs are chunked as the state tree is
    out_chunk = STATE_CHUNK if out_state else TRACE_CHUNK
    if o >= len(want) or ra["outputs"][o]["root"] == rb["outputs"][o]["root"] or \
            c >= max(1, -(-size("float32", want[o]) // out_chunk)):
        raise Refused("output")
    for opening, r in zip(p["claimed"], (ra, rb)):
        if opening[0] != c or not opens(opening, r["outputs"][o]["root"], size("float32", want[o]), out_state):
            raise Refused("claimed_chunk")
    ca, cb = p["claimed"][0][1], p["claimed"][1][1]
    if ca == cb:
        raise Refused("claimed_chunk")
    first = next(i for i in range(0, len(ca), 4) if ca[i:i + 4] != cb[i:i + 4])
    element = c * (out_chunk // 4) + first // 4
    row = element // rows(want[o])[1]
    for i, (e, openings, proof) in enumerate(zip(inputs, p["reads"], p["state"])):
        state = "state" in e
        chunk, total = (STATE_CHUNK if state else TRACE_CHUNK), size(e["dtype"], e["shape"])
        if total > CONST["SLICED_INPUT_BYTES"]:
            plan = planned(read_elements(ra["kind"], attrs, i, e["shape"], o, want[o], element, row), total, state)
            if [(x[0], x[1] if len(x) == 5 else None) for x in openings] != plan or not all(
                    opens(x, e["root"], total, state) if len(x) == 3 else sliced_opens(x, e["root"], total)
                    for x in openings):
                raise Refused("reads")
        elif reads_whole(ra["kind"], attrs, o, i):
            needed = list(range(max(1, -(-total // chunk))))
        else:
            w = rows(e["shape"])[1] * 4
            needed = sorted({i for r in read_rows(ra["kind"], attrs, row) for i in range(r * w // chunk,
                                                                                       -(-(r + 1) * w // chunk))})
        if total <= CONST["SLICED_INPUT_BYTES"] and ([x[0] for x in openings] != needed or any(
                len(x) != 3 or not opens(x, e["root"], total, state) for x in openings)):
            raise Refused("reads")
        if state != (proof is not None) or (state and not state_proven(e, proof, a["pre_state"])):
            raise Refused("state_input")
    return "accept", "guilty", [peer_id(k) for k in _wrong(p, ra, want, element, row, first)]


def _wrong(p, record, want, element, row, first):
    import numpy as np

    from open1b.protocol.dispute.reference import compute_rows

    arrays = []
    for e, openings in zip(record["inputs"], p["reads"]):
        raw = bytearray(size(e["dtype"], e["shape"]))
        chunk = STATE_CHUNK if "state" in e else TRACE_CHUNK
        for x in openings:
            if len(x) == 5:  # a sliced opening: slice s at s·1024 of its chunk
                for k, s in enumerate(x[1]):
                    raw[x[0] * chunk + s * 1024:x[0] * chunk + (s + 1) * 1024] = x[2][k * 1024:(k + 1) * 1024]
            else:
                raw[x[0] * chunk:x[0] * chunk + len(x[1])] = x[1]
        arrays.append(np.frombuffer(bytes(raw), "<f4" if e["dtype"] == "float32" else "<i4").reshape(e["shape"]))
    if record["kind"] == "cross_entropy" and not 0 <= arrays[1].min() <= arrays[1].max() < arrays[0].shape[1]:
        raise Refused("bad_input")
    value = compute_rows(record["kind"], arrays, record["attrs"], p["output"], row, row + 1)
    expected = value[element - row * rows(want[p["output"]])[1]].astype("<f4").tobytes()
    traces = [decode(t, CONST["MAX_TRACE_SIZE"]) for t in p["traces"]]
    return [t["tracer"] for t, (_, data, _) in zip(traces, p["claimed"]) if data[first:first + 4] != expected]
