"""Every op kind the referee re-executes, against deterministic/'s kernel on random inputs, bit for
bit; and over a slice of output rows with every input row the kind does not read poisoned with
NaN, so the reads table (:meth:`OpKind.reads`) is checked too."""

import numpy as np
import pytest

from open1b.deterministic import activation, attention, loss, matmul, norm, optimizer, reduction
from open1b.deterministic.attention import attention_scale
from open1b.protocol.dispute.ops import KINDS, ROWS, rows_of
from open1b.protocol.dispute.reference import compute_rows

F = np.float32


def _bits(x) -> int:
    return int(np.float32(x).view(np.uint32))


def _randn(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(F)


def _case(kind: str, rng):
    """(inputs, attrs, the kernel's outputs) of one random op of ``kind``."""
    if kind == "add":
        a, b = _randn(rng, 70, 50), _randn(rng, 70, 50)
        return [a, b], {}, [reduction.KERNELS[False][2](a, b)]
    if kind == "plus_zero":
        a = _randn(rng, 300)
        a[::7] = -0.0
        return [a], {}, [reduction.KERNELS[False][3](a)]
    if kind == "gelu":
        u = _randn(rng, 40, 96, scale=4.0)
        return [u], {}, [activation.KERNELS[False][0](u)]
    if kind == "gelu_backward":
        u, dy = _randn(rng, 40, 96, scale=4.0), _randn(rng, 40, 96)
        return [u, dy], {}, [activation.KERNELS[False][1](u, dy)]
    if kind == "adamw":
        p, g, m = _randn(rng, 33, 65), _randn(rng, 33, 65), _randn(rng, 33, 65, scale=0.1)
        v = np.abs(_randn(rng, 33, 65, scale=0.01))
        s = optimizer.AdamWScalars.for_step(lr=F(6e-4), beta1=F(0.9), beta2=F(0.95), eps=F(1e-8),
                                            weight_decay=F(0.1), beta1_pow=F(0.9**3), beta2_pow=F(0.95**3),
                                            coef=F(0.731))
        attrs = dict(zip(KINDS["adamw"].attrs, map(_bits, s.args())))
        return [p, g, m, v], attrs, list(optimizer.KERNELS[False](p, g, m, v, *s.args()))
    if kind == "rmsnorm":
        x, g, eps = _randn(rng, 50, 100, scale=3.0), _randn(rng, 100), F(1e-5)
        y, rstd = norm.KERNELS[False][0](x, g, eps)
        return [x, g], {"eps_bits": _bits(eps)}, [y, rstd]
    if kind == "causal_softmax":
        s, scale = _randn(rng, 6, 70, 70, scale=5.0), attention_scale(64)
        return [s], {"scale_bits": _bits(scale)}, [attention.KERNELS[False][3](s, scale)]
    if kind == "cross_entropy":
        logits, targets = _randn(rng, 60, 256, scale=4.0), rng.integers(0, 256, 60).astype(np.int32)
        inv_n = F(1) / F(240)
        total, dlogits = loss.KERNELS[False](logits, targets, inv_n)
        return [logits, targets], {"inv_n_bits": _bits(inv_n)}, [np.array([total], F), dlogits]
    raise AssertionError(kind)


MATMULS = [  # (a shape, b shape, trans_a, trans_b, structure): the model's products, odd sizes
    ((37, 70), (70, 45), False, False, matmul.DENSE),  # x @ w, K not a multiple of 32
    ((37, 45), (70, 45), False, True, matmul.DENSE),  # dy @ w.T
    ((70, 37), (70, 45), True, False, matmul.DENSE),  # x.T @ dy
    ((3, 40, 16), (3, 40, 16), False, True, matmul.CAUSAL_OUTPUT),  # Q Kᵀ
    ((3, 40, 40), (3, 40, 16), False, False, matmul.A_LOWER),  # P V
    ((3, 40, 40), (3, 40, 16), True, False, matmul.A_UPPER),  # Pᵀ dO
]


def _matmul_case(shape_a, shape_b, trans_a, trans_b, structure, rng):
    a, b = _randn(rng, *shape_a), _randn(rng, *shape_b)
    if structure in (matmul.A_LOWER, matmul.A_UPPER):  # the zeros the structure names are in op(a)
        lower = (structure == matmul.A_LOWER) != trans_a
        a = (np.tril(a) if lower else np.triu(a)).astype(F)
    a3, b3 = (x if x.ndim == 3 else x[None] for x in (a, b))
    out = matmul.MATMUL[False](a3, b3, trans_a, trans_b, structure)
    out = out if a.ndim == 3 else out[0]
    return [a, b], {"trans_a": int(trans_a), "trans_b": int(trans_b), "structure": structure}, [out]


def _check(kind, inputs, attrs, outputs, rng):
    for index, want in enumerate(outputs):
        rows, _ = rows_of(want.shape)
        got = compute_rows(kind, inputs, attrs, index, 0, rows)
        assert got.tobytes() == want.reshape(-1).tobytes(), f"{kind} output {index}"
        # a slice of rows, from inputs whose unread rows are NaN
        r0 = int(rng.integers(0, rows))
        r1 = int(rng.integers(r0 + 1, rows + 1))
        poisoned = []
        for x, how in zip(inputs, KINDS[kind].reads(index, attrs)):
            if how == ROWS and x.dtype == F:
                n, w = rows_of(x.shape)
                y = np.full((n, w), np.nan, F)
                y[r0:r1] = x.reshape(n, w)[r0:r1]
                x = y.reshape(x.shape)
            poisoned.append(x)
        n, w = rows_of(want.shape)
        got = compute_rows(kind, poisoned, attrs, index, r0, r1)
        assert got.tobytes() == want.reshape(n, w)[r0:r1].tobytes(), f"{kind} output {index} rows {r0}:{r1}"


@pytest.mark.parametrize("kind", sorted(set(KINDS) - {"matmul"}))
def test_reference_equals_the_kernel_bitwise(kind):
    rng = np.random.default_rng(sorted(KINDS).index(kind))
    for _ in range(3):
        _check(kind, *_case(kind, rng), rng)


@pytest.mark.parametrize("spec", MATMULS, ids=lambda s: f"{s[0]}x{s[1]}-t{int(s[2])}{int(s[3])}-s{s[4]}")
def test_matmul_reference_equals_the_kernel_bitwise(spec):
    rng = np.random.default_rng(len(spec[0]) * 10 + spec[4])
    _check("matmul", *_matmul_case(*spec, rng), rng)


def test_every_kind_is_tested():
    assert set(KINDS) == {"add", "plus_zero", "gelu", "gelu_backward", "adamw", "rmsnorm", "causal_softmax",
                          "matmul", "cross_entropy"}
