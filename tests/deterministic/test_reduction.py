"""The summation order: streaming tree = level-by-level tree, zero padding, and the sum kernels."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from open1b.deterministic import reduction
from open1b.deterministic.reduction import K_CHUNK, STACK_DEPTH, fixed_sum, pairwise_tree, stack_push, stack_total

from .conftest import F, rand, same_bits

finite32 = st.floats(-1e6, 1e6, width=32, allow_subnormal=True)


def streaming_tree(partials: np.ndarray) -> np.float32:
    # The form every kernel uses (binary counter), run as Python on numpy float32 scalars.
    stack, count = np.empty(STACK_DEPTH, F), 0
    for p in partials:
        count = stack_push(stack, count, F(p))
    return F(stack_total(stack, count))


@settings(max_examples=300, deadline=None)
@given(st.lists(finite32, max_size=300))
def test_streaming_tree_equals_level_by_level_tree(values):
    partials = np.array(values, F)
    assert same_bits(streaming_tree(partials), pairwise_tree(partials))


@settings(max_examples=200, deadline=None)
@given(st.lists(finite32, max_size=400), st.integers(0, 200), st.booleans())
def test_trailing_zeros_do_not_change_a_sum(values, zeros, negative):
    terms = np.array(values, F)
    padded = np.concatenate([terms, np.full(zeros, F(-0.0) if negative else F(0.0))])
    assert same_bits(fixed_sum(padded), fixed_sum(terms))


def test_leading_zeros_can_change_a_sum():
    # Why dV and dK are defined as full-length sums: zeros *before* the terms shift the chunks.
    # Chunk sums 1, 2**-24, 2**-24: (1 + 2**-24) + 2**-24 = 1, but 0 + 1 and 2**-24 + 2**-24
    # pair up once a zero chunk leads: 1 + 2**-23.
    terms = np.zeros(3 * K_CHUNK, F)
    terms[0], terms[K_CHUNK], terms[2 * K_CHUNK] = F(1.0), F(2.0**-24), F(2.0**-24)
    shifted = np.concatenate([np.zeros(K_CHUNK, F), terms])
    assert (fixed_sum(terms), fixed_sum(shifted)) == (F(1.0), F(1 + 2.0**-23))


def test_tree_order_is_observable():
    # Four 32-chunks summing to 1, 2**-24, 2**-24, 2**-24. The tree gives
    # (1 + 2**-24) + (2**-24 + 2**-24) = 1 + 2**-23; a left fold rounds to 1 at every step.
    x = np.zeros(4 * K_CHUNK, F)
    x[0], x[32], x[64], x[96] = F(1), F(2.0**-24), F(2.0**-24), F(2.0**-24)
    assert fixed_sum(x) == F(1 + 2.0**-23)
    assert F(reduction.row_sum(x, np.empty(STACK_DEPTH, F))) == F(1 + 2.0**-23)


@pytest.mark.parametrize("n", [0, 1, 31, 32, 33, 95, 257, 1000])
def test_chunk_sums_and_sum_rows_match_reference(backend, n):
    rng = np.random.default_rng(n)
    x = rand(rng, n)
    assert same_bits(backend.sumsq(x), fixed_sum(x * x))
    m = rand(rng, n, 70)  # 70 columns: a partial column block in the CPU kernel
    assert same_bits(backend.sum_rows(m), fixed_sum(m))


def test_add_and_plus_zero_are_elementwise_fadd(backend):
    rng = np.random.default_rng(1)
    a, b = rand(rng, 3, 5, 7), rand(rng, 3, 5, 7)
    assert same_bits(backend.add(a, b), a + b)
    a[0, 0, :2] = F(-0.0), F(0.0)
    assert same_bits(backend.plus_zero(a), np.zeros_like(a) + a) and not np.signbit(backend.plus_zero(a)[0, 0, 0])
