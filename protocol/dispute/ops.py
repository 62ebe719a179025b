"""The op kinds a fraud proof can name: their operands, attributes, and which rows of each input
one row of each output reads (docs/protocol.md §18.2). Pure data; no numpy.

A tensor's *rows*: a 0-D tensor is one row of one element, a 1-D tensor of n elements is n rows of
one element, and a tensor of shape (…, w) is prod(…) rows of w elements, in C order. An input
read ``ROWS`` by an output means output row r is a function of input row r alone (elementwise
ops, the row kernels, the left operand of a product); ``WHOLE`` means it may read any element;
``SPLIT`` and ``MERGE`` are the head copies' row maps (:func:`input_rows`).
This is what lets a proof carry only the input chunks that one output chunk depends on.

Attributes are float32 bit patterns or small integers, never CBOR floats: a float32 travels as its
exact bits, so no encoder can round it.
"""

from __future__ import annotations

from dataclasses import dataclass

ROWS = "rows"
WHOLE = "whole"
SPLIT = "split"
MERGE = "merge"

F32 = "float32"
I32 = "int32"


@dataclass(frozen=True)
class OpKind:
    name: str
    inputs: tuple[tuple[str, str], ...]
    """(name, dtype) of each operand, in the kernel's argument order."""
    outputs: tuple[str, ...]
    """The name of each float32 output, in the kernel's result order."""
    attrs: tuple[str, ...]
    """Attribute names; ``*_bits`` attributes are float32 bit patterns (u32)."""

    def dtypes(self, count: int) -> list[str]:
        """The input dtypes of an op of this kind with ``count`` inputs (``clip`` takes any number)."""
        if self.name == "clip":
            return [self.inputs[0][1]] * count if count else ["at least one"]
        return [d for _, d in self.inputs]

    def reads(self, output: int, attrs: dict, inputs: int | None = None) -> tuple[str, ...]:
        """For output ``output``, ``ROWS`` or ``WHOLE`` per input (see module doc); ``inputs`` is
        the number of inputs of a kind that takes any number (``clip``)."""
        inputs = self.inputs if inputs is None else range(inputs)
        if self.name == "matmul":
            return (WHOLE if attrs["trans_a"] else ROWS, WHOLE)
        if self.name == "cross_entropy":
            return (WHOLE, WHOLE) if output == 0 else (ROWS, ROWS)
        if self.name == "rmsnorm":
            return (ROWS, WHOLE)
        if self.name == "rmsnorm_backward":
            return (ROWS, WHOLE, ROWS, ROWS, ROWS)
        if self.name == "sum_rows":
            return (WHOLE,)  # output element c is column c's sum
        if self.name == "embed":
            return (WHOLE, WHOLE, ROWS)  # row r reads the token's row of wte and position r % T of wpe
        if self.name == "scatter_add":
            return (ROWS, WHOLE, WHOLE)  # token t's row: every position holding t
        if self.name == "split_heads":
            return (SPLIT,)
        if self.name in ("merge_heads", "merge_qkv"):
            return tuple(MERGE for _ in inputs)
        if self.name in ("sumsq", "clip"):
            return tuple(WHOLE for _ in inputs)
        return tuple(ROWS for _ in inputs)


_ADAMW_ATTRS = ("beta1_bits", "one_minus_beta1_bits", "beta2_bits", "one_minus_beta2_bits", "decay_bits",
                "step_size_bits", "sqrt_bias2_bits", "eps_bits", "coef_bits")

KINDS: dict[str, OpKind] = {k.name: k for k in (
    OpKind("add", (("a", F32), ("b", F32)), ("out",), ()),
    OpKind("plus_zero", (("a", F32),), ("out",), ()),
    OpKind("gelu", (("u", F32),), ("out",), ()),
    OpKind("gelu_backward", (("u", F32), ("dy", F32)), ("du",), ()),
    OpKind("adamw", (("p", F32), ("g", F32), ("m", F32), ("v", F32)), ("p", "m", "v"), _ADAMW_ATTRS),
    OpKind("rmsnorm", (("x", F32), ("g", F32)), ("y", "rstd"), ("eps_bits",)),
    OpKind("rmsnorm_backward", (("x", F32), ("g", F32), ("rstd", F32), ("dy", F32), ("dres", F32)), ("dx", "dg_terms"),
           ()),
    OpKind("causal_softmax", (("s", F32),), ("p",), ("scale_bits",)),
    OpKind("causal_softmax_backward", (("p", F32), ("dp", F32)), ("ds",), ("scale_bits",)),
    OpKind("sum_rows", (("x", F32),), ("out",), ()),
    OpKind("embed", (("wte", F32), ("wpe", F32), ("tokens", I32)), ("x",), ()),
    OpKind("scatter_add", (("dwte", F32), ("dx", F32), ("tokens", I32)), ("dwte",), ()),
    OpKind("split_heads", (("x", F32),), ("heads",), ("col0", "width", "seq_len", "n_heads")),
    OpKind("merge_heads", (("o", F32),), ("x",), ("seq_len", "n_heads")),
    OpKind("merge_qkv", (("dq", F32), ("dk", F32), ("dv", F32)), ("dqkv",), ("seq_len", "n_heads")),
    OpKind("zeros", (), ("zeros",), ("rows", "cols")),
    OpKind("sumsq", (("g", F32),), ("sumsq",), ()),
    OpKind("clip", (("sumsq", F32),), ("norm_coef",), ("max_norm_bits",)),  # one input per parameter
    OpKind("matmul", (("a", F32), ("b", F32)), ("out",), ("trans_a", "trans_b", "structure")),
    OpKind("cross_entropy", (("logits", F32), ("targets", I32)), ("loss", "dlogits"), ("inv_n_bits",)),
)}
"""The op kinds the referee re-executes this version. The trace names other ops too (run-format
§11.2: the head copies, the embedding's scatter-add, clipping); a proof naming one of those is
not judgeable yet (``[IGNORE] unsupported_op``)."""

MATMUL_STRUCTURES = {0: "dense", 1: "causal_output", 2: "a_lower", 3: "a_upper"}
"""deterministic/matmul.py's structure codes: names of zeros a kernel may skip. Only
``causal_output`` changes the result (outputs above the diagonal are +0.0)."""


def rows_of(shape: tuple[int, ...]) -> tuple[int, int]:
    """(rows, row width) of a tensor of ``shape`` (module doc)."""
    if len(shape) == 0:
        return 1, 1
    if len(shape) == 1:
        return shape[0], 1
    n = 1
    for d in shape[:-1]:
        n *= d
    return n, shape[-1]


def output_shapes(kind: str, attrs: dict, shapes: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """The shapes of op ``kind``'s outputs for inputs of ``shapes``; ValueError where the inputs
    do not fit the kind (the kernels' layouts, deterministic/)."""
    def same(*xs):
        if any(x != xs[0] for x in xs):
            raise ValueError(f"{kind}: operands of different shapes {xs}")
        return xs[0]

    if kind in ("add", "gelu_backward"):
        return [same(*shapes)]
    if kind in ("plus_zero", "gelu"):
        return [shapes[0]]
    if kind == "adamw":
        return [same(*shapes)] * 3
    if kind == "rmsnorm":
        x, g = shapes
        if len(x) != 2 or g != (x[1],):
            raise ValueError(f"rmsnorm: x {x} and gain {g}")
        return [x, (x[0],)]
    if kind in ("causal_softmax", "causal_softmax_backward"):
        s = same(*shapes)
        if len(s) != 3 or s[1] != s[2]:
            raise ValueError(f"{kind}: scores {s}")
        return [s]
    if kind == "rmsnorm_backward":
        x, g, rstd, dy, dres = shapes
        if len(x) != 2 or g != (x[1],) or rstd != (x[0],) or same(x, dy, dres) != x:
            raise ValueError(f"rmsnorm_backward: operands {shapes}")
        return [x, x]
    if kind == "sum_rows":
        (x,) = shapes
        if len(x) != 2:
            raise ValueError(f"sum_rows: {x}")
        return [(x[1],)]
    if kind == "scatter_add":
        dwte, dx, tokens = shapes
        if len(dwte) != 2 or len(dx) != 2 or dx[1] != dwte[1] or tokens != (dx[0],):
            raise ValueError(f"scatter_add: operands {shapes}")
        return [dwte]
    if kind == "split_heads":
        (x,) = shapes
        t, h, c0, w = attrs["seq_len"], attrs["n_heads"], attrs["col0"], attrs["width"]
        if len(x) != 2 or not t or not h or x[0] % t or w % h or c0 + w > x[1]:
            raise ValueError(f"split_heads: {x} with {attrs}")
        return [(x[0] // t * h, t, w // h)]
    if kind in ("merge_heads", "merge_qkv"):
        o = same(*shapes)
        t, h = attrs["seq_len"], attrs["n_heads"]
        if len(o) != 3 or not h or o[0] % h or o[1] != t:
            raise ValueError(f"{kind}: {o} with {attrs}")
        return [(o[0] // h * t, len(shapes) * h * o[2])]
    if kind == "zeros":
        return [(attrs["rows"], attrs["cols"])]
    if kind == "sumsq":
        return [(1,)]
    if kind == "clip":
        if any(s != (1,) for s in shapes):
            raise ValueError(f"clip: operands {shapes}")
        return [(2,)]
    if kind == "embed":
        wte, wpe, tokens = shapes
        if len(wte) != 2 or len(wpe) != 2 or wpe[1] != wte[1] or len(tokens) != 1 or tokens[0] % wpe[0]:
            raise ValueError(f"embed: operands {shapes}")
        return [(tokens[0], wte[1])]
    if kind == "matmul":
        a, b = shapes
        if len(a) != len(b) or len(a) not in (2, 3) or attrs["trans_a"] > 1 or attrs["trans_b"] > 1 or \
                attrs["structure"] not in MATMUL_STRUCTURES:
            raise ValueError(f"matmul: operands {a}, {b}, attributes {attrs}")
        a3, b3 = (x if len(x) == 3 else (1, *x) for x in (a, b))
        (batch, m, k), (batch_b, k_b, n) = (
            (a3[0], a3[2], a3[1]) if attrs["trans_a"] else a3, (b3[0], b3[2], b3[1]) if attrs["trans_b"] else b3)
        if batch != batch_b or k != k_b:
            raise ValueError(f"matmul: operands {a}, {b} do not multiply")
        return [(batch, m, n) if len(a) == 3 else (m, n)]
    if kind == "cross_entropy":
        logits, targets = shapes
        if len(logits) != 2 or targets != (logits[0],):
            raise ValueError(f"cross_entropy: logits {logits}, targets {targets}")
        return [(1,), logits]
    raise ValueError(f"unknown op kind {kind!r}")


def input_rows(how: str, row: int, attrs: dict) -> list[int]:
    """The rows of an input read ``how`` (not ``WHOLE``) that output row ``row`` reads: row r
    itself (``ROWS``); for ``split_heads``, output row (b·H + h)·T + t is a piece of input row
    b·T + t; for the merges, output row b·T + t gathers row (b·H + h)·T + t of each head h."""
    if how == ROWS:
        return [row]
    t_len, heads = attrs["seq_len"], attrs["n_heads"]
    if how == SPLIT:
        bh, t = divmod(row, t_len)
        return [bh // heads * t_len + t]
    b, t = divmod(row, t_len)
    return [(b * heads + h) * t_len + t for h in range(heads)]
