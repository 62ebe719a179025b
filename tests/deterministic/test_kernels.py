"""Compiled kernels vs their numpy float32 same-order references: identical bytes and dtypes."""

import numpy as np
import pytest

from open1b.deterministic import adamw, layers, loss, reduction

F = np.float32


def rand(rng, *shape, scale=1.0):
    # Values with full 24-bit mantissas so any change of order shows up in the bits.
    return (rng.standard_normal(shape) * scale).astype(F)


def same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype == F and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("n", [0, 1, 5, 31, 32, 33, 64, 95, 128, 257, 1000])
def test_fixed_sum_matches_reference_and_tree_shape(n):
    rng = np.random.default_rng(n)
    x = rand(rng, n)
    got = reduction.fixed_sum(x, np.empty(reduction.n_chunks(n), F))
    assert same_bits(F(got), reduction.fixed_sum_reference(x))


def test_tree_order_is_observable():
    # Four 32-chunks summing to 1, 2**-24, 2**-24, 2**-24. The tree gives
    # (1 + 2**-24) + (2**-24 + 2**-24) = 1 + 2**-23; a left fold rounds to 1 at every step.
    x = np.zeros(128, F)
    x[0], x[32], x[64], x[96] = F(1), F(2.0**-24), F(2.0**-24), F(2.0**-24)
    assert reduction.fixed_sum(x, np.empty(4, F)) == F(1 + 2.0**-23)


@pytest.mark.parametrize("m, k, n", [(3, 1, 2), (5, 32, 7), (128, 32, 64), (128, 64, 256), (64, 128, 256), (7, 100, 3)])
def test_matmul_nt_bitwise(m, k, n):
    rng = np.random.default_rng(m * 1000 + k)
    a, bt = rand(rng, m, k), rand(rng, n, k)
    assert same_bits(layers.matmul_nt(a, bt), layers.matmul_nt_reference(a, bt))


def test_linear_forward_backward_bitwise():
    rng = np.random.default_rng(1)
    x, w, b, dy = rand(rng, 128, 32), rand(rng, 32, 64), rand(rng, 64), rand(rng, 128, 64)
    assert same_bits(layers.linear_forward(x, w, b), layers.linear_forward_reference(x, w, b))
    for got, ref in zip(layers.linear_backward(x, w, dy), layers.linear_backward_reference(x, w, dy)):
        assert same_bits(got, ref)


def test_relu_and_embedding_bitwise():
    rng = np.random.default_rng(2)
    z, dy = rand(rng, 16, 8), rand(rng, 16, 8)
    z[0, 0] = F(np.nan)
    assert same_bits(layers.relu_forward(z), layers.relu_forward_reference(z))
    assert same_bits(layers.relu_backward(z, dy), layers.relu_backward_reference(z, dy))
    table = rand(rng, 10, 4)
    tokens = np.array([3, 3, 0, 9, 3, 1], np.int32)  # repeats: scatter-add order matters
    dx = rand(rng, 6, 4)
    assert same_bits(layers.embedding_forward(table, tokens), layers.embedding_forward_reference(table, tokens))
    assert same_bits(layers.embedding_backward(tokens, dx, 10), layers.embedding_backward_reference(tokens, dx, 10))


def test_softmax_cross_entropy_bitwise():
    rng = np.random.default_rng(3)
    logits = rand(rng, 128, 256, scale=4.0)
    targets = rng.integers(0, 256, 128).astype(np.int32)
    got_loss, got_grad = loss.softmax_cross_entropy(logits, targets)
    ref_loss, ref_grad = loss.softmax_cross_entropy_reference(logits, targets)
    assert same_bits(F(got_loss), ref_loss) and same_bits(got_grad, ref_grad)


def test_adamw_bitwise_and_float32_only():
    rng = np.random.default_rng(4)
    p, g, m = rand(rng, 300), rand(rng, 300), rand(rng, 300, scale=0.1)
    v = np.abs(rand(rng, 300, scale=0.01))
    scalars = [F(1e-2), F(0.9), F(0.999), F(1e-8), F(0.01), F(0.9) ** 3, F(0.999) ** 3]
    got = adamw.adamw_update(p, g, m, v, *scalars)
    ref = adamw.adamw_update_reference(p, g, m, v, *scalars)
    for a, b in zip(got, ref):
        assert same_bits(a, b)


def test_float64_scalars_would_change_bits():
    # Why the wrappers insist on np.float32 scalars: a Python float compiles a float64 path.
    rng = np.random.default_rng(5)
    p, g, m = rand(rng, 3000), rand(rng, 3000), rand(rng, 3000, scale=0.1)
    v = np.abs(rand(rng, 3000, scale=0.01))
    s32 = [F(1e-2), F(0.9), F(0.999), F(1e-8), F(0.01), F(0.9), F(0.999)]
    s64 = [float(s) for s in s32]
    p32 = adamw.adamw_update(p, g, m, v, *s32)[0]
    p64 = adamw.adamw_update(p, g, m, v, *s64)[0]
    assert p64.dtype == F and p32.tobytes() != p64.tobytes()
