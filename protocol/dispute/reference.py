"""The referee's re-execution of one op over a range of output rows: numpy float32, bit-exact
with deterministic/'s kernels (tests/protocol/test_dispute_reference.py compares every kind
with the kernels on random inputs, bit for bit).

Each function takes the op's inputs as full-shape arrays of which only the rows the op reads
for the wanted output rows are meaningful (:meth:`.ops.OpKind.reads`; the referee fills the
rest with NaN), and returns output ``output``'s rows ``r0:r1`` flattened in C order. The
operations and their order are those the kernels' docstrings specify; the comments here name
only what differs in form (selects for branches, lanes for loops).
"""

from __future__ import annotations

import math

import numpy as np

from .float32 import K_CHUNK, expf, ffma, fixed_sum, logf, pairwise, sigmoidf
from .ops import rows_of

F = np.float32
_ONE = F(1.0)
_ZERO = F(0.0)

# GELU (deterministic/activation.py)
_C1 = F(0.044715)
_C2 = F(2.0 * math.sqrt(2.0 / math.pi))
_C3 = F(3.0 * 0.044715)


def _f32(bits: int) -> np.float32:
    return np.uint32(bits).view(np.float32)


def _rows(a: np.ndarray, r0: int, r1: int) -> np.ndarray:
    n, w = rows_of(a.shape)
    return a.reshape(n, w)[r0:r1]


def _scan_max(x: np.ndarray) -> np.ndarray:
    """The kernels' ascending max scan over the last axis (``if x_j > m: m = x_j``): the first
    maximum is kept, and a NaN is never taken, so this is not ``np.max`` when NaNs or signed
    zeros are in the row."""
    m = x[..., 0]
    for j in range(1, x.shape[-1]):
        m = np.where(x[..., j] > m, x[..., j], m)
    return m


def _add(inputs, attrs, output, r0, r1):
    return _rows(inputs[0], r0, r1) + _rows(inputs[1], r0, r1)


def _plus_zero(inputs, attrs, output, r0, r1):
    return _ZERO + _rows(inputs[0], r0, r1)


def _gate(u):
    return sigmoidf(_C2 * (u + _C1 * ((u * u) * u)))


def _gelu(inputs, attrs, output, r0, r1):
    u = _rows(inputs[0], r0, r1)
    return u * _gate(u)


def _gelu_backward(inputs, attrs, output, r0, r1):
    u, dy = _rows(inputs[0], r0, r1), _rows(inputs[1], r0, r1)
    s = _gate(u)
    dz = _C2 * (_ONE + _C3 * (u * u))
    return dy * (s + u * ((s * (_ONE - s)) * dz))


def _adamw(inputs, attrs, output, r0, r1):
    p, g, m, v = (_rows(x, r0, r1) for x in inputs)
    b1, omb1, b2, omb2, decay, step_size, sqrt_bias2, eps, coef = (_f32(attrs[k]) for k in (
        "beta1_bits", "one_minus_beta1_bits", "beta2_bits", "one_minus_beta2_bits", "decay_bits", "step_size_bits",
        "sqrt_bias2_bits", "eps_bits", "coef_bits"))
    g = g * coef
    m = b1 * m + omb1 * g
    v = b2 * v + omb2 * (g * g)
    p = p * decay - step_size * (m / (np.sqrt(v) / sqrt_bias2 + eps))
    return (p, m, v)[output]


def _rmsnorm(inputs, attrs, output, r0, r1):
    x, g = _rows(inputs[0], r0, r1), inputs[1].reshape(-1)
    inv_d = _ONE / F(x.shape[1])
    rstd = _ONE / np.sqrt(fixed_sum(x * x) * inv_d + _f32(attrs["eps_bits"]))
    if output == 1:
        return rstd[:, None]
    return (x * rstd[:, None]) * g


def _causal_softmax(inputs, attrs, output, r0, r1):
    s = inputs[0]
    t_len = s.shape[-1]
    scale = _f32(attrs["scale_bits"])
    flat = s.reshape(-1, t_len)
    out = np.zeros((r1 - r0, t_len), np.float32)
    for r in range(r0, r1):
        i = r % t_len  # the query position: row i attends to keys 0..i
        x = flat[r, : i + 1] * scale
        e = expf(x - _scan_max(x))
        out[r - r0, : i + 1] = e / fixed_sum(e)
    return out


def _rmsnorm_backward(inputs, attrs, output, r0, r1):
    x, g = _rows(inputs[0], r0, r1), inputs[1].reshape(-1)
    rstd, dy, dres = _rows(inputs[2], r0, r1), _rows(inputs[3], r0, r1), _rows(inputs[4], r0, r1)
    xh = x * rstd
    dxh = dy * g
    if output == 1:
        return dy * xh  # dg_terms
    mdot = fixed_sum(dxh * xh) * (_ONE / F(x.shape[1]))
    return dres + (dxh - xh * mdot[:, None]) * rstd


def _causal_softmax_backward(inputs, attrs, output, r0, r1):
    p, dp = inputs
    t_len = p.shape[-1]
    scale = _f32(attrs["scale_bits"])
    fp, fdp = p.reshape(-1, t_len), dp.reshape(-1, t_len)
    out = np.zeros((r1 - r0, t_len), np.float32)
    for r in range(r0, r1):
        i = r % t_len
        pi, dpi = fp[r, : i + 1], fdp[r, : i + 1]
        out[r - r0, : i + 1] = (pi * (dpi - fixed_sum(pi * dpi))) * scale
    return out


def _sum_rows(inputs, attrs, output, r0, r1):
    return fixed_sum(inputs[0][:, r0:r1].T)[:, None]  # output element c: column c summed over rows


def _embed(inputs, attrs, output, r0, r1):
    wte, wpe, tokens = inputs
    rows = np.arange(r0, r1)
    return wte[tokens[r0:r1].astype(np.int64)] + wpe[rows % wpe.shape[0]]


def _scatter_add(inputs, attrs, output, r0, r1):
    dwte, dx, tokens = inputs
    out = dwte[r0:r1].copy()
    for p in range(tokens.shape[0]):  # ascending positions: each adds dx[p] to its token's row
        t = int(tokens[p])
        if r0 <= t < r1:
            out[t - r0] = out[t - r0] + dx[p]
    return out


def _split_heads(inputs, attrs, output, r0, r1):
    x = inputs[0]
    t_len, heads, col0, width = attrs["seq_len"], attrs["n_heads"], attrs["col0"], attrs["width"]
    hd = width // heads
    out = []
    for r in range(r0, r1):  # output row (b·H + h)·T + t is x[b·T + t, col0 + h·hd : …]
        bh, t = divmod(r, t_len)
        b, h = divmod(bh, heads)
        out.append(x[b * t_len + t, col0 + h * hd: col0 + (h + 1) * hd])
    return np.stack(out)


def _merge(inputs, attrs, output, r0, r1):
    t_len, heads = attrs["seq_len"], attrs["n_heads"]
    out = []
    for r in range(r0, r1):  # output row b·T + t: head h of each input at (b·H + h, t), side by side
        b, t = divmod(r, t_len)
        out.append(np.concatenate([o[b * heads + h, t] for o in inputs for h in range(heads)]))
    return np.stack(out)


def _zeros(inputs, attrs, output, r0, r1):
    return np.zeros((r1 - r0, attrs["cols"]), np.float32)  # +0.0: the final norm's residual gradient


def _sumsq(inputs, attrs, output, r0, r1):
    g = inputs[0].reshape(-1)
    return fixed_sum(g * g).reshape(1, 1)  # Σ fmul(g, g) over the flat tensor (optimizer.py)


_CLIP_EPS = F(1e-6)


def _clip(inputs, attrs, output, r0, r1):
    norm = np.sqrt(fixed_sum(np.concatenate([x.reshape(-1) for x in inputs])))  # the tensors' sums, in P's order
    coef = _f32(attrs["max_norm_bits"]) / (norm + _CLIP_EPS)
    coef = coef if coef < _ONE else _ONE  # Python's min(1, coef), as optimizer.py writes it
    return np.array([norm, coef], np.float32)[r0:r1, None]


def _matmul(inputs, attrs, output, r0, r1):
    a, b = inputs
    a3, b3 = (x if x.ndim == 3 else x[None] for x in (a, b))
    if attrs["trans_a"]:
        a3 = np.swapaxes(a3, 1, 2)
    if attrs["trans_b"]:
        b3 = np.swapaxes(b3, 1, 2)
    m, k = a3.shape[1], a3.shape[2]
    chunks = -(-k // K_CHUNK)
    # The K_CHUNK-term chunks are independent folds: lanes here. K is padded with zero terms to
    # whole chunks, which changes no fold (a fold from +0.0 never holds -0.0, and s + (±0·0) == s),
    # and adds no chunk, so the tree over chunk sums is the kernel's.
    pad = chunks * K_CHUNK - k
    out = []
    r = r0
    while r < r1:  # row r of the output is row r % m of batch r // m
        bi, i0 = divmod(r, m)
        i1 = min(m, i0 + (r1 - r))
        ai = np.pad(a3[bi, i0:i1], ((0, 0), (0, pad))).reshape(i1 - i0, chunks, K_CHUNK)
        bb = np.pad(b3[bi], ((0, pad), (0, 0))).reshape(chunks, K_CHUNK, b3.shape[2])
        acc = np.zeros((i1 - i0, chunks, b3.shape[2]), np.float32)
        for kk in range(K_CHUNK):
            acc = ffma(ai[:, :, kk, None], bb[None, :, kk, :], acc)  # the fold: s = ffma(a, b, s)
        block = pairwise([acc[:, c] for c in range(chunks)]) if k else np.zeros((i1 - i0, b3.shape[2]), np.float32)
        if attrs["structure"] == 1:  # causal_output: columns past the row are +0.0
            block = np.where(np.arange(b3.shape[2])[None, :] <= np.arange(i0, i1)[:, None], block, _ZERO)
        out.append(block)
        r += i1 - i0
    return np.concatenate(out).astype(np.float32)


def matmul_element(inputs: list[np.ndarray], attrs: dict, r: int, j: int) -> np.float32:
    """Element (r, j) of a matmul's output alone: each output column is its own fold over K, so
    this is :func:`_matmul` of row r against column j of op(b) (a product's disputed row costs a
    full row of folds otherwise). ``causal_output`` zeros column j past row r's position."""
    a, b = inputs
    b3 = b if b.ndim == 3 else b[None]
    if attrs["structure"] == 1 and j > r % (a.shape[-1] if attrs["trans_a"] else a.shape[-2]):
        return _ZERO
    column = b3[:, j:j + 1, :] if attrs["trans_b"] else b3[:, :, j:j + 1]
    with np.errstate(all="ignore"):
        return _matmul([a, column], {**attrs, "structure": 0}, 0, r, r + 1)[0, 0]


def _cross_entropy(inputs, attrs, output, r0, r1):
    logits, targets = inputs
    inv_n = _f32(attrs["inv_n_bits"])
    if output == 0:
        r0, r1 = 0, logits.shape[0]  # the loss reads every row
    lg, tg = logits[r0:r1], targets.reshape(-1)[r0:r1].astype(np.int64)
    m = _scan_max(lg)
    e = expf(lg - m[:, None])
    s = fixed_sum(e)
    rows = np.arange(r1 - r0)
    if output == 0:
        row_loss = logf(s) - (lg[rows, tg] - m)
        return (fixed_sum(row_loss) * inv_n).reshape(1, 1)
    p = e / s[:, None]
    p[rows, tg] = p[rows, tg] - _ONE
    return p * inv_n


COMPUTE = {
    "add": _add, "plus_zero": _plus_zero, "gelu": _gelu, "gelu_backward": _gelu_backward, "adamw": _adamw,
    "rmsnorm": _rmsnorm, "rmsnorm_backward": _rmsnorm_backward, "causal_softmax": _causal_softmax,
    "causal_softmax_backward": _causal_softmax_backward, "sum_rows": _sum_rows, "embed": _embed, "matmul": _matmul,
    "cross_entropy": _cross_entropy, "scatter_add": _scatter_add, "split_heads": _split_heads, "merge_heads": _merge,
    "merge_qkv": _merge, "zeros": _zeros, "sumsq": _sumsq, "clip": _clip,
}  # fmt: skip


def compute_rows(kind: str, inputs: list[np.ndarray], attrs: dict, output: int, r0: int, r1: int) -> np.ndarray:
    """Output ``output`` of op ``kind``, rows ``r0:r1``, as a flat float32 array (module doc)."""
    with np.errstate(all="ignore"):  # inf and nan are values here, as on the device
        return np.ascontiguousarray(COMPUTE[kind](inputs, attrs, output, r0, r1), np.float32).reshape(-1)
