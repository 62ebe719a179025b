"""A small built-in corpus, a byte-level tokenizer and the batch schedule.

The batch for a step is a pure function of (corpus, seed, step), so a replayer derives it
instead of receiving it. The corpus below was written for this project (public domain,
CC0); it is ASCII, so its UTF-8 bytes are its characters.
"""

from __future__ import annotations

import hashlib

import numpy as np

from .config import GPTConfig, Topology

CORPUS = """\
A training run is a long sequence of small, exact steps. Each step reads a batch of
examples, computes a loss, turns the loss into gradients, and nudges every weight of the
model by a tiny amount. If every one of those operations is defined down to the last bit,
then anybody who holds the state before a step and the batch for that step can compute
the state after it, and can check that the trainer did the same.

That is the idea behind an auditor network. The trainer publishes commitments to its
states as it goes. An auditor picks a step, fetches the state before it, replays the step
on its own machine, and compares the hash of what it got with the hash the trainer
committed to. If they match, the step was honest. If they differ, somebody computed
something else, and the difference can be narrowed down to a single step and a single
tensor.

Floating point arithmetic makes this harder than it sounds. Addition of floating point
numbers is not associative: adding the same numbers in a different order can give a
different answer in the last bit. A matrix multiplication sums thousands of products, and
a fast library is free to pick whatever order suits the cache, the vector width or the
number of threads. Two machines running the same program can therefore disagree, and
neither of them is wrong.

The cure is to take the freedom away. We fix the order of every sum: a sequential fold
over chunks of thirty-two terms, and then a balanced tree over the partial sums, with an
odd element carried up to the next level. We forbid the compiler from fusing a multiply
and an add into one instruction, because a fused operation rounds once where the written
program rounds twice. We never call the exponential or the logarithm of the system
library, because different libraries round differently; instead we compute them with a
short polynomial whose every step is an ordinary addition, multiplication or division.
Those basic operations are correctly rounded by the IEEE standard on every processor
that follows it, so the same inputs give the same bits everywhere.

Small numbers need a policy too. Some processors and some settings flush very small
results, the subnormal numbers, to zero. A gradient element that is tiny on one machine
and exactly zero on another will eventually move a weight differently. We keep gradual
underflow, and a program that finds itself in a process that flushes refuses to start
rather than produce bits that nobody else can reproduce.

Randomness is handled in the same spirit. A random number generator from a library may
change its stream between versions, so the initial weights and the choice of training
examples come from a counter based rule: hash the seed, the name of the tensor and the
index of the element, and turn the bits of the hash into a number with an exact
conversion. The rule is short enough to write in a paragraph and to implement again in
any language.

None of this makes training slower in principle. The order of a sum can be fixed and
still be fast, if the order is chosen with the hardware in mind and then written down as
part of the specification. What matters is that the order is a property of the problem,
the length of the sum, and never of the machine that happens to run it.

The model in this file is deliberately tiny. It reads one byte, looks up a vector for it,
passes the vector through one hidden layer with a rectifier, and predicts the next byte.
It will not write poetry. It exists so that every part of the system, from the kernels to
the network messages, can be built and tested end to end before the real model arrives.
A walking skeleton is small, but every bone is in place.

Numbers in a computer are a finite set. Between one and two there are about eight million
single precision values, evenly spaced; between two and four there are just as many,
twice as far apart. Every arithmetic result is rounded to one of them, and the rule for
choosing which one is part of the standard: the nearest, and on a tie the one whose last
bit is zero. A careful program can rely on that rule as firmly as on the integers.
"""


def corpus_bytes() -> bytes:
    """The corpus as UTF-8 bytes."""
    return CORPUS.encode("utf-8")


def corpus_tokens() -> np.ndarray:
    """Byte-level tokens of the corpus: one int32 in [0, 256) per UTF-8 byte."""
    return tokenize(CORPUS)


def tokenize(text: str) -> np.ndarray:
    """UTF-8 bytes of ``text`` as an int32 array."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)


def corpus_digest() -> bytes:
    """blake2b-256 of the corpus bytes (names the data in a run manifest)."""
    return hashlib.blake2b(corpus_bytes(), digest_size=32).digest()


def batch_for_step(
    corpus_tokens: np.ndarray, seed: int, step: int, config: GPTConfig, topology: Topology
) -> np.ndarray:
    """The int32 (ranks, micro_batches, micro_batch_size, seq_len + 1) batch of step ``step``.

    Rule (version ``open1b/data/v1``): the step's sequences are numbered i = 0, 1, … in the
    order (rank, micro-batch, row); sequence i is ``corpus_tokens[o : o + seq_len + 1]`` with
    ``o = int.from_bytes(blake2b(b"open1b/data/v1" + seed.to_bytes(8, "little")
    + step.to_bytes(8, "little") + i.to_bytes(4, "little"), digest_size=8).digest(), "little")
    % (len(corpus_tokens) - seq_len - 1)``.
    """
    n = len(corpus_tokens)
    span = n - config.seq_len - 1
    if span <= 0:
        raise ValueError(f"corpus of {n} tokens is too short for seq_len {config.seq_len}")
    prefix = b"open1b/data/v1" + seed.to_bytes(8, "little") + step.to_bytes(8, "little")
    out = np.empty((topology.sequences, config.seq_len + 1), np.int32)
    for i in range(topology.sequences):
        digest = hashlib.blake2b(prefix + i.to_bytes(4, "little"), digest_size=8).digest()
        offset = int.from_bytes(digest, "little") % span
        out[i] = corpus_tokens[offset : offset + config.seq_len + 1]
    return out.reshape(topology.ranks, topology.micro_batches, topology.micro_batch_size, config.seq_len + 1)
