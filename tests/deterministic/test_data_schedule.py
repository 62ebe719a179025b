"""Corpus, tokenizer and the counter-based batch rule."""

import hashlib

import numpy as np

from open1b.deterministic import PRESETS, batch_for_step, corpus_digest, corpus_tokens, tokenize
from open1b.deterministic.data import CORPUS

CONFIG, TOPOLOGY = PRESETS["tiny"].config, PRESETS["tiny"].topology


def test_corpus_size_and_digest():
    raw = CORPUS.encode("utf-8")
    assert 4_000 <= len(raw) <= 10_000 and raw.isascii()
    assert corpus_digest() == hashlib.blake2b(raw, digest_size=32).digest()
    toks = corpus_tokens()
    assert toks.dtype == np.int32 and toks.tobytes() == np.frombuffer(raw, np.uint8).astype(np.int32).tobytes()
    assert tokenize("é").tolist() == [0xC3, 0xA9]


def test_batch_follows_documented_rule():
    toks = corpus_tokens()
    seed, step = 9, 123456
    got = batch_for_step(toks, seed, step, CONFIG, TOPOLOGY)
    shape = (TOPOLOGY.ranks, TOPOLOGY.micro_batches, TOPOLOGY.micro_batch_size, CONFIG.seq_len + 1)
    assert got.dtype == np.int32 and got.shape == shape
    span = len(toks) - CONFIG.seq_len - 1
    rows = got.reshape(-1, CONFIG.seq_len + 1)  # sequence i is (rank, micro-batch, row) in C order
    for i in range(TOPOLOGY.sequences):
        msg = b"open1b/data/v1" + seed.to_bytes(8, "little") + step.to_bytes(8, "little") + i.to_bytes(4, "little")
        o = int.from_bytes(hashlib.blake2b(msg, digest_size=8).digest(), "little") % span
        assert rows[i].tolist() == toks[o : o + CONFIG.seq_len + 1].tolist()


def test_batches_differ_by_step_and_seed():
    toks = corpus_tokens()
    a = batch_for_step(toks, 0, 0, CONFIG, TOPOLOGY)
    assert a.tobytes() == batch_for_step(toks, 0, 0, CONFIG, TOPOLOGY).tobytes()
    assert a.tobytes() != batch_for_step(toks, 0, 1, CONFIG, TOPOLOGY).tobytes()
    assert a.tobytes() != batch_for_step(toks, 1, 0, CONFIG, TOPOLOGY).tobytes()
    assert bytes(a[0, 0, 0].astype(np.uint8)) == b" spaced; between two and four the"  # pinned test vector
