"""The shipped corpus, the ``bytes/v1`` tokenizer and the ``open1b/data/v2`` order (docs/run-format.md §4).

Known answers were computed once from the rule as the spec writes it (restated in
:func:`spec_index` with hashlib alone) and are pinned so that any change to the rule shows.
"""

import dataclasses
import hashlib
from importlib import resources

import numpy as np
import pytest

from open1b.deterministic import PRESETS, Topology
from open1b.deterministic.data import (
    BUILTIN_CORPUS_DIGEST, DATA_ORDER, TOKENIZER, batch_for_step, builtin_corpus_bytes, builtin_dataset, encode,
    sample_index, step_sample_indices,
)  # fmt: skip
from open1b.deterministic.errors import BatchFormatError, ConfigError
from open1b.deterministic.samples import Dataset, cut_samples
from open1b.protocol.merkle import merkle_root

TINY, SMALL = PRESETS["tiny"], PRESETS["small"]


def spec_index(seed, k, r, m, j, n):
    msg = (b"open1b/data/v2\x00" + seed.to_bytes(8, "little") + k.to_bytes(8, "little") + r.to_bytes(4, "little")
           + m.to_bytes(4, "little") + j.to_bytes(4, "little"))  # fmt: skip
    return int.from_bytes(hashlib.blake2b(msg, digest_size=32).digest()[:8], "little") % n


KNOWN_INDICES = [  # (seed, step, rank, micro_batch, row, N) -> index
    ((0, 0, 0, 0, 0, 31244), 14325),
    ((0, 0, 1, 1, 1, 31244), 25754),
    ((7, 3, 1, 0, 1, 31244), 6306),
    ((2**64 - 1, 2**64 - 1, 2**32 - 1, 2**32 - 1, 2**32 - 1, 31244), 22881),
    ((0, 5, 0, 0, 3, 3905), 760),
    ((123456789, 42, 0, 0, 0, 1000003), 584639),
]


@pytest.mark.parametrize("args, index", KNOWN_INDICES)
def test_known_answers(args, index):
    assert sample_index(*args) == index == spec_index(*args)


def test_counters_out_of_range_are_refused():
    for bad in [(-1, 0, 0, 0, 0, 5), (2**64, 0, 0, 0, 0, 5), (0, 2**64, 0, 0, 0, 5), (0, 0, 2**32, 0, 0, 5),
                (0, 0, 0, 0, 2**32, 5), (0, 0, 0, 0, 0, 0)]:  # fmt: skip
        with pytest.raises(ValueError):
            sample_index(*bad)


def test_step_indices_are_the_rule_per_rank_micro_batch_row():
    topo = Topology(ranks=3, micro_batches=2, micro_batch_size=4)
    got = step_sample_indices(11, 77, topo, 1000)
    assert got.shape == (3, 2, 4) and got.dtype == np.int64
    for r, m, j in np.ndindex(got.shape):
        assert got[r, m, j] == spec_index(11, 77, r, m, j, 1000)
    # Rank r's rows do not depend on how many ranks there are: a rank computes its share alone.
    assert step_sample_indices(11, 77, dataclasses.replace(topo, ranks=1), 1000).tolist() == got[:1].tolist()
    assert got.tolist() != step_sample_indices(11, 78, topo, 1000).tolist()
    assert got.tolist() != step_sample_indices(12, 77, topo, 1000).tolist()


def test_shipped_corpus_is_the_committed_licensed_file():
    corpus = resources.files("open1b.deterministic").joinpath("corpus")
    data = corpus.joinpath("cpython-3.11.7-docstrings.txt").read_bytes()
    assert builtin_corpus_bytes() == data and len(data) == 999_838 <= 1_000_000
    assert hashlib.blake2b(data, digest_size=32).digest() == BUILTIN_CORPUS_DIGEST
    assert data.decode("utf-8").startswith("== __future__ ==\nRecord of phased-in incompatible language changes.")
    notice = corpus.joinpath("NOTICE").read_text()
    assert "PSF License Agreement" in notice and "Python Software\nFoundation; All Rights Reserved" in notice
    assert "PYTHON SOFTWARE FOUNDATION LICENSE VERSION 2" in corpus.joinpath("LICENSE-PSF.txt").read_text()


def test_tokenizer_is_utf8_bytes():
    assert TOKENIZER == "bytes/v1" and DATA_ORDER == "open1b/data/v2"
    assert encode("aé€").tolist() == [0x61, 0xC3, 0xA9, 0xE2, 0x82, 0xAC]
    assert encode("").dtype == np.uint8


@pytest.mark.parametrize("preset, n, root_hex", [
    ("tiny", 31244, "221eff3921df24b9e198a3fb4ad2b5a99f9db0d93e2aaf3f613b4fd5b6308dee"),
    ("small", 3905, "7bdbf3ae7af58251d9fd5d02ca029fa3d459ef191d60551acd46416c90a43f5f"),
])  # fmt: skip
def test_builtin_dataset_sizes_and_roots(preset, n, root_hex):
    config = PRESETS[preset].config
    ds = builtin_dataset(config)
    L = config.seq_len + 1
    assert ds.n == n == (999_838 - 1) // (L - 1) and ds.sample_len == L and ds.vocab_size == 256
    tokens = np.frombuffer(builtin_corpus_bytes(), np.uint8)
    assert ds.samples[-1].tobytes() == tokens[(n - 1) * (L - 1) : n * (L - 1) + 1].tobytes()
    assert ds.root == bytes.fromhex(root_hex) == merkle_root(
        [hashlib.blake2b(b"open1b/sample/v1\x00\x01" + row.tobytes(), digest_size=32).digest() for row in ds.samples])


def test_batch_rows_are_the_committed_samples():
    config, topo = TINY.config, TINY.topology
    ds = builtin_dataset(config)
    batch = batch_for_step(ds, 5, 9, config, topo)
    assert batch.dtype == np.int32
    assert batch.shape == (topo.ranks, topo.micro_batches, topo.micro_batch_size, config.seq_len + 1)
    for r, m, j in np.ndindex(batch.shape[:3]):
        assert batch[r, m, j].astype(np.uint8).tobytes() == ds.samples[spec_index(5, 9, r, m, j, ds.n)].tobytes()
    assert batch.tobytes() == batch_for_step(ds, 5, 9, config, topo).tobytes()


def test_batch_refuses_samples_that_do_not_fit_the_model():
    config = TINY.config
    short = Dataset.from_samples(cut_samples(np.arange(100) % 256, config.seq_len), 256)  # one token short
    with pytest.raises(BatchFormatError):
        batch_for_step(short, 0, 0, config, TINY.topology)
    with pytest.raises(ConfigError):
        builtin_dataset(dataclasses.replace(config, vocab_size=128))
