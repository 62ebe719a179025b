"""Every kernel vs its slow numpy reference: identical bytes, float32 outputs, serial and parallel."""

import numpy as np
import pytest

from open1b.deterministic import activation, attention, embedding, epilogue, loss, matmul, norm, optimizer
from open1b.deterministic.attention import attention_scale

from .conftest import F, rand, same_bits


@pytest.mark.parametrize("batch, m, k, n", [(1, 3, 1, 2), (1, 5, 32, 7), (2, 9, 70, 33), (1, 17, 100, 50),
                                            (3, 4, 64, 16), (1, 3, 0, 4), (1, 64, 257, 31)])  # fmt: skip
@pytest.mark.parametrize("trans_a, trans_b", [(False, False), (False, True), (True, False), (True, True)])
def test_matmul_bitwise(backend, batch, m, k, n, trans_a, trans_b):
    rng = np.random.default_rng(batch * 1000 + m * 100 + k)
    a = rand(rng, batch, *((k, m) if trans_a else (m, k)))
    b = rand(rng, batch, *((n, k) if trans_b else (k, n)))
    got = backend.matmul(a, b, trans_a, trans_b)
    assert same_bits(got, matmul.matmul_reference(a, b, trans_a, trans_b))
    if batch == 1:  # the 2-D entry point is the same product
        assert same_bits(backend.matmul(a[0], b[0], trans_a, trans_b), got[0])


@pytest.mark.parametrize("t", [5, 40, 100])
def test_matmul_structure_changes_no_bit(backend, t):
    # The causal-attention shortcuts (skipped tiles, dropped trailing and pushed leading zero
    # chunks) against the full products, on operands that have exactly those zeros.
    rng = np.random.default_rng(t)
    q, k, v = rand(rng, 3, t, 16), rand(rng, 3, t, 16), rand(rng, 3, t, 16)
    dense = backend.matmul(q, k, False, True)
    causal = backend.matmul(q, k, False, True, matmul.CAUSAL_OUTPUT)
    assert same_bits(causal, np.where(np.tri(t, dtype=bool), dense, F(0)))
    assert same_bits(causal, matmul.matmul_reference(q, k, False, True, matmul.CAUSAL_OUTPUT))
    p = np.tril(rand(rng, 3, t, t))  # +0.0 above the diagonal, as the causal softmax writes
    assert same_bits(backend.matmul(p, v, False, False, matmul.A_LOWER), matmul.matmul_reference(p, v))
    assert same_bits(backend.matmul(p, v, True, False, matmul.A_UPPER), matmul.matmul_reference(p, v, True, False))


@pytest.mark.parametrize("rows", [4, 8])
def test_every_register_tile_gives_the_same_bits(rows):
    # The tile is chosen per instruction set (8 rows on AVX-512, 4 elsewhere); both compile and
    # run on any x86 CPU, so both are checked here whatever this machine chooses.
    kernel = matmul.MATMUL_BY_TILE[rows][False]
    rng = np.random.default_rng(rows)
    a, b = rand(rng, 2, 70, 100), rand(rng, 2, 33, 100)  # rows and columns not whole tiles
    assert same_bits(kernel(a, b, True, True, matmul.DENSE), matmul.matmul_reference(a, b, True, True))
    p, v = np.tril(rand(rng, 2, 45, 45)), rand(rng, 2, 45, 19)
    assert same_bits(kernel(p, v, False, False, matmul.A_LOWER), matmul.matmul_reference(p, v))
    assert same_bits(kernel(p, v, True, False, matmul.A_UPPER), matmul.matmul_reference(p, v, True, False))


def test_tile_rows_follow_the_instruction_set():
    assert matmul.tile_rows_for("+64bit,+avx2,+fma,+avx512f,+avx512bw") == 8
    assert matmul.tile_rows_for("+64bit,+avx2,+fma,-avx512f") == 4
    assert matmul.tile_rows_for("") == 4  # NUMBA_CPU_NAME=generic: no features at all


def test_matmul_is_batch_invariant(backend):
    # Unlike BLAS: a row's result does not depend on the other rows (nothing depends on m).
    rng = np.random.default_rng(7)
    a, b = rand(rng, 1, 37, 90), rand(rng, 1, 90, 21)
    full = backend.matmul(a, b)
    assert same_bits(backend.matmul(a[:, 5:12].copy(), b), full[:, 5:12])


def test_rmsnorm_forward_backward_bitwise(backend):
    rng = np.random.default_rng(1)
    x, g, dy, dres = rand(rng, 13, 70), rand(rng, 70), rand(rng, 13, 70), rand(rng, 13, 70)
    eps = F(1e-5)
    y, rstd = backend.rmsnorm(x, g, eps)
    ry, rrstd = norm.rmsnorm_forward_reference(x, g, eps)
    assert same_bits(y, ry) and same_bits(rstd, rrstd)
    dx, dg_terms = backend.rmsnorm_backward(x, g, rstd, dy, dres)
    rdx, rdg = norm.rmsnorm_backward_reference(x, g, rstd, dy, dres)
    assert same_bits(dx, rdx) and same_bits(dg_terms, rdg)


def test_gelu_forward_backward_bitwise(backend):
    rng = np.random.default_rng(2)
    u = np.concatenate([rand(rng, 4, 50, scale=3.0).reshape(-1), F([0.0, -0.0, 100.0, -100.0, 1e-30])]).reshape(5, 41)
    dy = rand(rng, 5, 41)
    assert same_bits(backend.gelu(u), activation.gelu_reference(u))
    assert same_bits(backend.gelu_backward(u, dy), activation.gelu_backward_reference(u, dy))


@pytest.mark.parametrize("m, k, n, trans_a, trans_b", [(9, 70, 33, False, False), (17, 100, 50, False, True),
                                                    (5, 32, 7, True, False), (1, 3, 1, True, True)])  # fmt: skip
def test_fused_epilogues_equal_the_separate_ops_bitwise(backend, m, k, n, trans_a, trans_b):
    # Each epilogue against its two ops run apart (the unfused path) and against the numpy
    # reference of that composition, 2-D and batched; GELU's inputs span its saturated tails.
    rng = np.random.default_rng(m * 100 + k)
    a = rand(rng, 2, *((k, m) if trans_a else (m, k)), scale=1.5)
    b = rand(rng, 2, *((n, k) if trans_b else (k, n)), scale=1.5)
    x, u = rand(rng, 2, m, n), rand(rng, 2, m, n, scale=4.0)
    product = backend.matmul(a, b, trans_a, trans_b)
    ref = {kind: matmul.matmul_fused_reference(a, b, trans_a, trans_b, kind, extra)
           for kind, extra in ((epilogue.ADD, x), (epilogue.GELU, None), (epilogue.GELU_BACKWARD, u))}  # fmt: skip
    for bi in (slice(None), 0):  # batched, then the 2-D entry point
        added = backend.matmul_add(x[bi], a[bi], b[bi], trans_a, trans_b)
        assert same_bits(added, backend.add(x[bi], product[bi])) and same_bits(added, ref[epilogue.ADD][0][bi])
        got_u, got_a = backend.matmul_gelu(a[bi], b[bi], trans_a, trans_b)
        assert same_bits(got_u, product[bi]) and same_bits(got_a, backend.gelu(product[bi]))
        assert same_bits(got_a, ref[epilogue.GELU][1][bi])
        du = backend.matmul_gelu_backward(u[bi], a[bi], b[bi], trans_a, trans_b)
        assert same_bits(du, backend.gelu_backward(u[bi], product[bi])) and same_bits(du, ref[epilogue.GELU_BACKWARD][0][bi])


def test_heads_split_and_merge_are_exact_copies(backend):
    rng = np.random.default_rng(3)
    seq_len, heads, d = 5, 3, 12
    qkv = rand(rng, 2 * seq_len, 3 * d)
    parts = [backend.split_heads(qkv, i * d, d, seq_len, heads) for i in range(3)]
    for i, part in enumerate(parts):
        assert same_bits(part, attention.split_heads_reference(qkv, i * d, d, seq_len, heads))
    assert same_bits(backend.merge_heads(parts[0], seq_len, heads), qkv[:, :d])
    assert same_bits(backend.merge_qkv(*parts, seq_len, heads), qkv)


def test_causal_softmax_forward_backward_bitwise(backend):
    rng = np.random.default_rng(4)
    s, dp = rand(rng, 3, 40, 40, scale=4.0), rand(rng, 3, 40, 40)  # 40 > K_CHUNK: rows of 1…2 chunks
    scale = attention_scale(16)
    p = backend.causal_softmax(s, scale)
    assert same_bits(p, attention.causal_softmax_reference(s, scale))
    assert not np.triu(p[0], 1).any() and np.signbit(p).sum() == 0  # masked entries are +0.0
    ds = backend.causal_softmax_backward(p, dp, scale)
    assert same_bits(ds, attention.causal_softmax_backward_reference(p, dp, scale))


def test_cross_entropy_bitwise(backend):
    rng = np.random.default_rng(5)
    logits = rand(rng, 70, 100, scale=4.0)
    targets = rng.integers(0, 100, 70).astype(np.int32)
    inv_n = F(1) / F(280)
    got_loss, got_grad = backend.cross_entropy(logits, targets, inv_n)
    ref_loss, ref_grad = loss.cross_entropy_reference(logits, targets, inv_n)
    assert same_bits(F(got_loss), ref_loss) and same_bits(got_grad, ref_grad)


def test_embedding_forward_and_scatter_add_bitwise(backend):
    rng = np.random.default_rng(6)
    wte, wpe = rand(rng, 10, 6), rand(rng, 4, 6)
    tokens = np.array([3, 3, 0, 9, 3, 1, 3, 3], np.int32)  # repeats: the scatter order matters
    assert same_bits(backend.embed(wte, wpe, tokens), embedding.embed_reference(wte, wpe, tokens))
    dwte, dx = rand(rng, 10, 6), rand(rng, 8, 6)
    expected = embedding.scatter_add_reference(dwte, dx, tokens)
    backend.scatter_add(dwte, dx, tokens)
    assert same_bits(dwte, expected)


def test_adamw_bitwise_and_inputs_untouched(backend):
    rng = np.random.default_rng(8)
    p, g, m = rand(rng, 30, 11), rand(rng, 30, 11), rand(rng, 30, 11, scale=0.1)
    v = np.abs(rand(rng, 30, 11, scale=0.01))
    before = [a.copy() for a in (p, g, m, v)]
    s = optimizer.AdamWScalars.for_step(lr=F(1e-2), beta1=F(0.9), beta2=F(0.95), eps=F(1e-8), weight_decay=F(0.1),
                                        beta1_pow=F(0.9) ** 3, beta2_pow=F(0.95) ** 3, coef=F(0.37))  # fmt: skip
    for got, ref in zip(backend.adamw(p, g, m, v, s), optimizer.adamw_reference(p, g, m, v, s)):
        assert same_bits(got, ref)
    assert all(same_bits(a, b) for a, b in zip((p, g, m, v), before))


def test_float64_operands_are_rejected(backend):
    # The primitives type float32 only: a float64 scalar is a compile error, never a silent promotion.
    rng = np.random.default_rng(9)
    x, g = rand(rng, 4, 8), rand(rng, 8)
    with pytest.raises(Exception, match="(?i)no implementation|typing"):
        backend.rmsnorm(x, g, 1e-5)
    with pytest.raises(Exception, match="(?i)no implementation|typing"):
        backend.rmsnorm(x.astype(np.float64), g.astype(np.float64), np.float64(1e-5))
