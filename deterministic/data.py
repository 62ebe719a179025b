"""The data a run trains on: the shipped corpus, the ``bytes/v1`` tokenizer, and the data order
``open1b/data/v2`` that picks each batch row's sample (docs/run-format.md §4).

A replayer derives the batch of step k from the run's committed samples (:mod:`.samples`)
instead of receiving it: row j of micro-batch μ of rank r holds sample
``sample_index(seed, k, r, μ, j, N)``, a counter-based rule written out below — not a NumPy or
torch random stream, whose output may change between versions.
"""

from __future__ import annotations

import functools
import hashlib
from importlib import resources

import numpy as np

from .config import GPTConfig, Topology
from .errors import BatchFormatError, ConfigError, DeterminismError
from .samples import Dataset, cut_samples

TOKENIZER = "bytes/v1"
TOKENIZER_VOCAB = 256
DATA_ORDER = "open1b/data/v2"
_ORDER_TAG = b"open1b/data/v2\x00"

BUILTIN_CORPUS = "cpython-3.11.7-docstrings"
BUILTIN_CORPUS_FILE = "cpython-3.11.7-docstrings.txt"
BUILTIN_CORPUS_DIGEST = bytes.fromhex("912d4a58d163746b41f41015ece09d75252bbb4a53378c9bc191b7ef362d1f49")
"""B2 of the shipped corpus file (made by ``corpus/build.py``), checked on every load."""

_U64 = 1 << 64
_U32 = 1 << 32


def encode(text: str) -> np.ndarray:
    """``bytes/v1``: the UTF-8 bytes of ``text``, one uint8 token per byte (vocab 256, no specials)."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).copy()


def tokenize(text: str) -> np.ndarray:
    """:func:`encode` as int32, the dtype batches use."""
    return encode(text).astype(np.int32)


@functools.cache
def builtin_corpus_bytes() -> bytes:
    """The shipped corpus file (package data ``corpus/``); :class:`DeterminismError` if this
    installation's copy is not the committed one, since no run could then be reproduced here."""
    data = resources.files(__package__).joinpath("corpus", BUILTIN_CORPUS_FILE).read_bytes()
    if hashlib.blake2b(data, digest_size=32).digest() != BUILTIN_CORPUS_DIGEST:
        raise DeterminismError(f"the installed {BUILTIN_CORPUS_FILE} is not the committed corpus")
    return data


@functools.cache
def _builtin_dataset(sample_len: int) -> Dataset:
    tokens = np.frombuffer(builtin_corpus_bytes(), dtype=np.uint8)  # bytes/v1 of UTF-8 text is its bytes
    return Dataset.from_samples(cut_samples(tokens, sample_len), TOKENIZER_VOCAB)


def builtin_dataset(config: GPTConfig) -> Dataset:
    """The shipped corpus cut into samples of ``config.seq_len + 1`` tokens (cached per length)."""
    if config.vocab_size < TOKENIZER_VOCAB:
        raise ConfigError(f"{TOKENIZER} needs vocab_size >= {TOKENIZER_VOCAB}, the config has {config.vocab_size}")
    return _builtin_dataset(config.seq_len + 1)


def sample_index(seed: int, step: int, rank: int, micro_batch: int, row: int, n_samples: int) -> int:
    """The sample of row ``row`` of micro-batch ``micro_batch`` of rank ``rank`` in step ``step``::

        i = u64le(B2("open1b/data/v2\\0" ‖ u64le(seed) ‖ u64le(step) ‖ u32le(rank)
                     ‖ u32le(micro_batch) ‖ u32le(row))[0:8]) mod N

    Rows draw with replacement; the modulo bias is below N / 2^64 (2^-49 for the shipped corpus).
    """
    if not (0 <= seed < _U64 and 0 <= step < _U64 and 0 <= rank < _U32 and 0 <= micro_batch < _U32
            and 0 <= row < _U32 and n_samples >= 1):  # fmt: skip
        raise ValueError("seed/step must fit u64, rank/micro_batch/row u32, and N >= 1")
    msg = (_ORDER_TAG + seed.to_bytes(8, "little") + step.to_bytes(8, "little") + rank.to_bytes(4, "little")
           + micro_batch.to_bytes(4, "little") + row.to_bytes(4, "little"))  # fmt: skip
    return int.from_bytes(hashlib.blake2b(msg, digest_size=32).digest()[:8], "little") % n_samples


def step_sample_indices(seed: int, step: int, topology: Topology, n_samples: int) -> np.ndarray:
    """The int64 (ranks, micro_batches, micro_batch_size) sample indices of step ``step``."""
    t = topology
    out = np.empty((t.ranks, t.micro_batches, t.micro_batch_size), np.int64)
    for r in range(t.ranks):
        for m in range(t.micro_batches):
            for j in range(t.micro_batch_size):
                out[r, m, j] = sample_index(seed, step, r, m, j, n_samples)
    return out


def batch_for_step(dataset: Dataset, seed: int, step: int, config: GPTConfig, topology: Topology) -> np.ndarray:
    """The int32 (ranks, micro_batches, micro_batch_size, seq_len + 1) batch of step ``step``: each
    row is the sample :func:`step_sample_indices` names, taken from ``dataset``."""
    if dataset.sample_len != config.seq_len + 1 or dataset.vocab_size > config.vocab_size:
        raise BatchFormatError(
            f"samples of {dataset.sample_len} tokens < {dataset.vocab_size} do not fit seq_len {config.seq_len},"
            f" vocab {config.vocab_size}")
    indices = step_sample_indices(seed, step, topology, dataset.n)
    return dataset.samples[indices].astype(np.int32)
