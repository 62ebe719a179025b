"""Samples: a token stream cut into N fixed rows, their digests, their Merkle commitment, and the
samples file (docs/run-format.md §4).

A run's batches are drawn only from its samples, and the manifest commits to them twice: by the
Merkle root over the sample digests (so one sample can be proven with a short path) and by the
blob address of the samples file (so peers can serve the file by its hash). A samples file read
from disk or a peer is never trusted: :func:`read_samples` bounds its size before reading, checks
every header field and the token range, and recomputes the root before returning a
:class:`Dataset`.

File layout (version 1), all integers little-endian::

    offset  size  field
    0       8     magic b"OPEN1BSM"
    8       2     u16 version = 1
    10      1     u8  token width w in bytes (1: u8 tokens, 2: u16le tokens)
    11      1     u8  reserved, 0
    12      4     u32 vocab_size V (every token < V; 1 <= V <= 256^w)
    16      4     u32 sample_len L (>= 2)
    20      8     u64 N, the number of samples (>= 1)
    28      4     u32 reserved, 0
    32      N·L·w the tokens, sample after sample

The file is exactly ``32 + N·L·w`` bytes. Sample digest: s_i = B2("open1b/sample/v1\\0" ‖ u8(w)
‖ the L·w token bytes of sample i); the root is ``merkle_root([s_0 … s_{N-1}])``.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from open1b.protocol.documents import sample_digest as _protocol_sample_digest
from open1b.protocol.hashing import blake2b256
from open1b.protocol.merkle import merkle_proof, merkle_root, verify_merkle_proof

from .bounded_read import FileRefused, open_regular
from .errors import SamplesFormatError, SamplesMismatchError
from .durable_write import write_atomic

SAMPLES_MAGIC = b"OPEN1BSM"
SAMPLES_VERSION = 1
_HEADER = struct.Struct("<8sHBBIIQI")
HEADER_SIZE = _HEADER.size  # 32
MAX_SAMPLES_BYTES = 1 << 26
"""Default bound on a samples file (64 MiB); the shipped corpus makes files of about 1 MB."""

_DTYPES = {1: np.dtype("<u1"), 2: np.dtype("<u2")}


def token_width(vocab_size: int) -> int:
    """Bytes per stored token: 1 when every token fits a u8, else 2."""
    if not 1 <= vocab_size <= 1 << 16:
        raise ValueError(f"vocab_size {vocab_size} is outside 1 … 65536")
    return 1 if vocab_size <= 256 else 2


def sample_digest(tokens: np.ndarray) -> bytes:
    """s_i of one sample (an array of the file's token dtype)."""
    return _protocol_sample_digest(tokens.tobytes(), tokens.dtype.itemsize)


def cut_samples(tokens: np.ndarray, sample_len: int) -> np.ndarray:
    """The (N, sample_len) samples of a token stream: sample i is ``tokens[i·(L-1) : i·(L-1) + L]``.

    Consecutive samples overlap by one token, so every adjacent pair (input, next token) of the
    stream is a training pair in exactly one sample; N = (len(tokens) - 1) // (L - 1) and the
    tokens after the last whole sample are dropped.
    """
    if sample_len < 2:
        raise ValueError(f"sample_len must be >= 2, got {sample_len}")
    stride = sample_len - 1
    n = (len(tokens) - 1) // stride
    if n < 1:
        raise ValueError(f"{len(tokens)} tokens make no sample of {sample_len}")
    windows = np.lib.stride_tricks.sliding_window_view(np.asarray(tokens), sample_len)
    return np.ascontiguousarray(windows[: n * stride : stride])


@dataclass(frozen=True, eq=False)
class Dataset:
    """N samples of ``sample_len`` tokens with their digests and Merkle root.

    Build one with :meth:`from_samples` (which computes digests and root) or :func:`read_samples`
    (which also checks them against an expected root); the array is read-only.
    """

    samples: np.ndarray  # (N, sample_len), dtype <u1 or <u2, read-only
    vocab_size: int
    digests: tuple[bytes, ...]
    root: bytes

    def __post_init__(self) -> None:
        s, dtype = self.samples, _DTYPES[token_width(self.vocab_size)]
        if s.ndim != 2 or s.dtype != dtype:
            raise ValueError(f"samples must be a 2-d {dtype} array, got {s.dtype} {s.shape}")
        if len(self.digests) != s.shape[0] or s.shape[0] < 1 or s.shape[1] < 2:
            raise ValueError("a dataset needs N >= 1 samples of >= 2 tokens and one digest per sample")

    @classmethod
    def from_samples(cls, samples: np.ndarray, vocab_size: int) -> Dataset:
        """Digests and root of ``samples`` (any integer array of tokens < ``vocab_size``)."""
        samples = np.asarray(samples)
        if samples.ndim != 2 or samples.shape[0] < 1 or samples.shape[1] < 2:
            raise ValueError(f"a dataset needs N >= 1 samples of >= 2 tokens, got shape {samples.shape}")
        if samples.min() < 0 or samples.max() >= vocab_size:
            raise ValueError(f"tokens must lie in [0, {vocab_size})")
        stored = np.array(samples, dtype=_DTYPES[token_width(vocab_size)], order="C")
        stored.flags.writeable = False
        digests = tuple(sample_digest(row) for row in stored)
        return cls(stored, vocab_size, digests, merkle_root(digests))

    @property
    def n(self) -> int:
        return int(self.samples.shape[0])

    @property
    def sample_len(self) -> int:
        return int(self.samples.shape[1])

    def proof(self, index: int) -> list[bytes]:
        """The Merkle audit path of sample ``index`` (RFC 6962 shape, :mod:`open1b.protocol.merkle`)."""
        return merkle_proof(self.digests, index)


def verify_sample(tokens: np.ndarray, index: int, n: int, proof: Sequence[bytes], root: bytes) -> bool:
    """True if ``tokens`` (the file's dtype) is sample ``index`` of the N = ``n`` samples under ``root``."""
    return verify_merkle_proof(sample_digest(tokens), index, n, proof, root)


# -- the samples file ----------------------------------------------------------------------------
def encode_samples(dataset: Dataset) -> bytes:
    s = dataset.samples
    header = _HEADER.pack(SAMPLES_MAGIC, SAMPLES_VERSION, s.dtype.itemsize, 0, dataset.vocab_size,
                          dataset.sample_len, dataset.n, 0)  # fmt: skip
    return header + s.tobytes()


def write_samples(path: Path, dataset: Dataset) -> bytes:
    """Write the samples file atomically; returns its blob address (B2 of its bytes)."""
    data = encode_samples(dataset)
    write_atomic(Path(path), data)  # a reader sees the old file or the whole new one, never a torn one
    return blake2b256(data)


def decode_samples(
    data: bytes,
    *,
    expected_root: bytes,
    expected_count: int,
    expected_sample_len: int | None = None,
    vocab_size: int | None = None,
    expected_digest: bytes | None = None,
) -> Dataset:
    """Parse and check a samples file's bytes; every check happens before the next field is used.

    :class:`SamplesFormatError` for a malformed, truncated or over-long file or an out-of-range
    token; :class:`SamplesMismatchError` for a well-formed file that is not the committed one.
    """
    # [REJECT] shorter than the header
    if len(data) < HEADER_SIZE:
        raise SamplesFormatError(f"samples file of {len(data)} bytes is shorter than its {HEADER_SIZE}-byte header")
    magic, version, width, reserved8, vocab, sample_len, n, reserved32 = _HEADER.unpack_from(data)
    # [REJECT] magic, then version, before any other field is interpreted
    if magic != SAMPLES_MAGIC:
        raise SamplesFormatError(f"not a samples file (magic {magic!r})")
    if version != SAMPLES_VERSION:
        raise SamplesFormatError(f"samples file version {version} is not supported; this node reads {SAMPLES_VERSION}")
    # [REJECT] header fields outside their ranges
    if width not in _DTYPES or reserved8 or reserved32:
        raise SamplesFormatError(f"samples header: token width {width} or reserved bytes invalid")
    if not 1 <= vocab <= 1 << (8 * width) or sample_len < 2 or n < 1:
        raise SamplesFormatError(f"samples header: vocab {vocab}, sample_len {sample_len}, N {n} invalid")
    if width != token_width(vocab):
        raise SamplesFormatError(f"samples header: width {width} is not the one vocab {vocab} calls for")
    # [REJECT] not the shape the manifest and config name
    if n != expected_count:
        raise SamplesMismatchError(f"samples file holds {n} samples; the run commits to {expected_count}")
    if expected_sample_len is not None and sample_len != expected_sample_len:
        raise SamplesMismatchError(f"samples of {sample_len} tokens; the model needs {expected_sample_len}")
    if vocab_size is not None and vocab != vocab_size:
        raise SamplesMismatchError(f"samples file vocab {vocab}; the tokenizer has {vocab_size}")
    # [REJECT] truncated or trailing bytes (sizes computed in Python ints: no overflow)
    size = HEADER_SIZE + n * sample_len * width
    if len(data) != size:
        raise SamplesFormatError(f"samples file is {len(data)} bytes; its header says {size}")
    # [REJECT] not the blob the manifest names
    if expected_digest is not None and blake2b256(data) != expected_digest:
        raise SamplesMismatchError("samples file is not the blob the run names")
    samples = np.frombuffer(data, dtype=_DTYPES[width], offset=HEADER_SIZE).reshape(n, sample_len)
    # [REJECT] a token outside the vocabulary
    if int(samples.max()) >= vocab:
        raise SamplesFormatError(f"samples file holds token {int(samples.max())} >= vocab {vocab}")
    dataset = Dataset.from_samples(samples, vocab)
    # [REJECT] the samples are not the committed ones
    if dataset.root != expected_root:
        raise SamplesMismatchError("samples do not hash to the committed samples_root")
    return dataset


def read_samples(
    path: Path,
    *,
    expected_root: bytes,
    expected_count: int,
    expected_sample_len: int | None = None,
    vocab_size: int | None = None,
    expected_digest: bytes | None = None,
    expected_size: int | None = None,
    max_bytes: int = MAX_SAMPLES_BYTES,
) -> Dataset:
    """The dataset in the samples file ``path``, checked as :func:`decode_samples` says; the file's
    size is checked (against ``expected_size`` and ``max_bytes``) before a byte is read."""
    path = Path(path)
    try:
        fd, size = open_regular(path, max_bytes)
    except FileRefused as exc:
        raise SamplesFormatError(f"cannot read samples file: {exc}") from None
    try:
        if expected_size is not None and size != expected_size:
            raise SamplesMismatchError(f"{path}: {size} bytes; the run names a file of {expected_size}")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(max_bytes + 1)  # bounded even if the file grew after fstat
    except OSError as exc:
        raise SamplesFormatError(f"cannot read samples file {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise SamplesFormatError(f"{path}: exceeds the samples limit of {max_bytes} bytes")
    return decode_samples(data, expected_root=expected_root, expected_count=expected_count,
                          expected_sample_len=expected_sample_len, vocab_size=vocab_size,
                          expected_digest=expected_digest)  # fmt: skip
