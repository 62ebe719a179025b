"""The data a run trains on: the shipped corpus, the ``bytes/v1`` tokenizer, and the data order
``open1b/data/v2`` that picks each batch row's sample (docs/run-format.md §4).

A replayer derives the batch of step k from the run's committed samples (:mod:`.samples`)
instead of receiving it: row j of micro-batch μ of rank r holds sample
``sample_index(seed, k, r, μ, j, N)``, a counter-based rule (:mod:`open1b.protocol.data_order`,
where a data proof's verifier finds it) — not a NumPy or
torch random stream, whose output may change between versions.
"""

from __future__ import annotations

import functools
import hashlib
from importlib import resources

import numpy as np

from open1b.protocol.data_order import DATA_ORDER, sample_index  # noqa: F401 (re-exported: proofs re-derive draws too)

from .config import GPTConfig, Topology
from .documents import CorpusSplit
from .errors import BatchFormatError, ConfigError, DeterminismError
from .samples import Dataset, cut_samples

TOKENIZER = "bytes/v1"
TOKENIZER_VOCAB = 256

BUILTIN_CORPUS = "cpython-3.11.7-docstrings"
BUILTIN_CORPUS_FILE = "cpython-3.11.7-docstrings.txt"
BUILTIN_CORPUS_DIGEST = bytes.fromhex("912d4a58d163746b41f41015ece09d75252bbb4a53378c9bc191b7ef362d1f49")
"""B2 of the shipped corpus file (made by ``corpus/build.py``), checked on every load."""


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
def builtin_split(held_out: int = 0) -> CorpusSplit:
    """The shipped corpus with its last ``held_out`` documents held out for evaluation."""
    return CorpusSplit.of(builtin_corpus_bytes(), held_out)


@functools.cache
def _builtin_dataset(sample_len: int, held_out: int, evaluation: bool) -> Dataset:
    split = builtin_split(held_out)
    stream = split.evaluation if evaluation else split.train
    tokens = np.frombuffer(stream, dtype=np.uint8)  # bytes/v1 of UTF-8 text is its bytes
    return Dataset.from_samples(cut_samples(tokens, sample_len), TOKENIZER_VOCAB)


def _check_vocab(config: GPTConfig) -> None:
    if config.vocab_size < TOKENIZER_VOCAB:
        raise ConfigError(f"{TOKENIZER} needs vocab_size >= {TOKENIZER_VOCAB}, the config has {config.vocab_size}")


def builtin_dataset(config: GPTConfig, held_out: int = 0) -> Dataset:
    """The training samples: the shipped corpus, less its last ``held_out`` documents, cut into
    samples of ``config.seq_len + 1`` tokens (cached)."""
    _check_vocab(config)
    return _builtin_dataset(config.seq_len + 1, held_out, False)


def builtin_eval_dataset(config: GPTConfig, held_out: int) -> Dataset:
    """The evaluation samples: the last ``held_out`` (≥ 1) documents cut the same way."""
    _check_vocab(config)
    if held_out < 1:
        raise ConfigError("an evaluation set needs at least one held-out document")
    return _builtin_dataset(config.seq_len + 1, held_out, True)


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
