"""Every op kind the referee re-executes, against deterministic/'s kernel on random inputs, bit for
bit; and over a slice of output rows with every input row the kind does not read poisoned with
NaN, so the reads table (:meth:`OpKind.reads`) is checked too."""

import numpy as np
import pytest

from open1b.deterministic import matmul
from open1b.protocol.dispute.ops import KINDS, WHOLE, input_rows, rows_of
from open1b.protocol.dispute.reference import compute_rows, matmul_element

from .dispute_cases import kernel_case, matmul_case

F = np.float32


MATMULS = [  # (a shape, b shape, trans_a, trans_b, structure): the model's products, odd sizes
    ((37, 70), (70, 45), False, False, matmul.DENSE),  # x @ w, K not a multiple of 32
    ((37, 45), (70, 45), False, True, matmul.DENSE),  # dy @ w.T
    ((70, 37), (70, 45), True, False, matmul.DENSE),  # x.T @ dy
    ((3, 40, 16), (3, 40, 16), False, True, matmul.CAUSAL_OUTPUT),  # Q Kᵀ
    ((3, 40, 40), (3, 40, 16), False, False, matmul.A_LOWER),  # P V
    ((3, 40, 40), (3, 40, 16), True, False, matmul.A_UPPER),  # Pᵀ dO
]


def _check(kind, inputs, attrs, outputs, rng):
    for index, want in enumerate(outputs):
        rows, _ = rows_of(want.shape)
        got = compute_rows(kind, inputs, attrs, index, 0, rows)
        assert got.tobytes() == want.reshape(-1).tobytes(), f"{kind} output {index}"
        # a slice of rows, from inputs whose unread rows are NaN
        r0 = int(rng.integers(0, rows))
        r1 = int(rng.integers(r0 + 1, rows + 1))
        poisoned = []
        for x, how in zip(inputs, KINDS[kind].reads(index, attrs, len(inputs))):
            if how != WHOLE and x.dtype == F:
                n, w = rows_of(x.shape)
                y = np.full((n, w), np.nan, F)
                for r in {i for row in range(r0, r1) for i in input_rows(how, row, attrs)}:
                    y[r] = x.reshape(n, w)[r]
                x = y.reshape(x.shape)
            poisoned.append(x)
        n, w = rows_of(want.shape)
        got = compute_rows(kind, poisoned, attrs, index, r0, r1)
        assert got.tobytes() == want.reshape(n, w)[r0:r1].tobytes(), f"{kind} output {index} rows {r0}:{r1}"


@pytest.mark.parametrize("kind", sorted(set(KINDS) - {"matmul"}))
def test_reference_equals_the_kernel_bitwise(kind):
    rng = np.random.default_rng(sorted(KINDS).index(kind))
    for _ in range(3):
        _check(kind, *kernel_case(kind, rng), rng)


@pytest.mark.parametrize("spec", MATMULS, ids=lambda s: f"{s[0]}x{s[1]}-t{int(s[2])}{int(s[3])}-s{s[4]}")
def test_matmul_reference_equals_the_kernel_bitwise(spec):
    rng = np.random.default_rng(len(spec[0]) * 10 + spec[4])
    _check("matmul", *matmul_case(*spec, rng), rng)


@pytest.mark.parametrize("spec", MATMULS, ids=lambda s: f"{s[0]}x{s[1]}-t{int(s[2])}{int(s[3])}-s{s[4]}")
def test_one_matmul_element_is_the_kernels_element(spec):
    """The referee computes a product's disputed element alone (matmul_element): every element,
    the causal zeros included, equals the kernel's bit for bit."""
    rng = np.random.default_rng(len(spec[0]) * 10 + spec[4] + 1)
    inputs, attrs, (want,) = matmul_case(*spec, rng)
    n, w = rows_of(want.shape)
    got = np.array([[matmul_element(inputs, attrs, r, j) for j in range(w)] for r in range(n)], F)
    assert got.tobytes() == want.reshape(n, w).tobytes()


def test_every_kind_is_tested():
    assert set(KINDS) == {"add", "plus_zero", "gelu", "gelu_backward", "adamw", "rmsnorm", "rmsnorm_backward",
                          "causal_softmax", "causal_softmax_backward", "sum_rows", "embed", "matmul", "cross_entropy",
                          "scatter_add", "split_heads", "merge_heads", "merge_qkv", "zeros", "sumsq", "clip"}
