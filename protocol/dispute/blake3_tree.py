"""BLAKE3's own tree inside one trace chunk, so a proof can carry 1 KiB slices of a 64 KiB chunk
instead of the chunk (docs/protocol.md §18.3, r27). numpy, many lanes at once: the referee extra's,
imported where a proof holds a sliced opening (``import open1b.protocol`` never loads it).

A trace chunk's digest is ``BLAKE3-derive_key(TRACE_CHUNK_CONTEXT, chunk ‖ u64le(i))`` (§18.1). For
a full chunk (65,536 bytes) that message is 65 BLAKE3 chunks of 1 KiB: the 64 *slices* of the
trace chunk, whose chaining values (CVs) are the leaves of a perfect tree of depth 6, and the 8
bytes of u64le(i) as BLAKE3 chunk 64; the digest is the ROOT parent of the 64-slice subtree and
that last chunk's CV. So slice s is proven by its bytes and the CVs of the maximal subtrees that
hold no carried slice, and the verifier recomputes the digest (the BLAKE3 spec's compression
function, chunk CVs and parent nodes, with the derived key and DERIVE_KEY_MATERIAL as it is
hashed). Checked against the ``blake3`` package in tests/protocol/test_dispute_slices.py.
"""

from __future__ import annotations

import struct
from typing import Sequence

import numpy as np

from .reads import SLICES
from .trace import TRACE_CHUNK_CONTEXT

_DEPTH = 6  # SLICES = 2^6 leaves
_IV = np.array([0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A, 0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19],
               np.uint32)  # fmt: skip
_PERMUTATION = [2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8]
CHUNK_START, CHUNK_END, PARENT, ROOT, DERIVE_KEY_CONTEXT, DERIVE_KEY_MATERIAL = 1, 2, 4, 8, 32, 64
_U32 = np.uint32


def _rotr(x: np.ndarray, n: int) -> np.ndarray:
    return (x >> _U32(n)) | (x << _U32(32 - n))


def _g(a, b, c, d, mx, my):
    a = a + b + mx
    d = _rotr(d ^ a, 16)
    c = c + d
    b = _rotr(b ^ c, 12)
    a = a + b + my
    d = _rotr(d ^ a, 8)
    c = c + d
    b = _rotr(b ^ c, 7)
    return a, b, c, d


def compress(cv: np.ndarray, block: np.ndarray, counter: np.ndarray, block_len, flags) -> np.ndarray:
    """The first 8 words of BLAKE3's compression of ``block`` (16 × N words) under ``cv`` (8 × N),
    per lane: the chaining value, or the digest of a ROOT compression. The four columns, then the
    four diagonals, are one lane-wise G each (rows of 4 × N)."""
    n = block.shape[1]
    cv = np.broadcast_to(cv, (8, n))
    a, b = cv[0:4].copy(), cv[4:8].copy()
    c = np.broadcast_to(_IV[0:4, None], (4, n)).copy()
    counter = np.broadcast_to(np.asarray(counter, np.uint64), (n,))
    d = np.stack([(counter & 0xFFFFFFFF).astype(_U32), (counter >> np.uint64(32)).astype(_U32),
                  np.broadcast_to(np.asarray(block_len, _U32), (n,)), np.broadcast_to(np.asarray(flags, _U32), (n,))])
    m = block
    with np.errstate(over="ignore"):
        for r in range(7):
            a, b, c, d = _g(a, b, c, d, m[0:8:2], m[1:8:2])
            b, c, d = b[[1, 2, 3, 0]], c[[2, 3, 0, 1]], d[[3, 0, 1, 2]]
            a, b, c, d = _g(a, b, c, d, m[8:16:2], m[9:16:2])
            b, c, d = b[[3, 0, 1, 2]], c[[2, 3, 0, 1]], d[[1, 2, 3, 0]]
            if r < 6:
                m = m[_PERMUTATION]
    return np.concatenate([a ^ c, b ^ d])


def _words(data: bytes, count: int) -> np.ndarray:
    """``data`` zero-padded to ``count`` 64-byte blocks, as (count, 16) little-endian words."""
    return np.frombuffer(data.ljust(64 * count, b"\0"), "<u4").reshape(count, 16).astype(_U32)


def _derived_key() -> np.ndarray:
    context = TRACE_CHUNK_CONTEXT.encode()  # one block: 21 bytes
    block = _words(context, 1).T
    return compress(_IV[:, None], block, 0, len(context), CHUNK_START | CHUNK_END | ROOT | DERIVE_KEY_CONTEXT)


KEY = _derived_key()
"""The key of TRACE_CHUNK_CONTEXT's key derivation, (8, 1) words."""


def slice_cvs(data: bytes, slice_indices: Sequence[int]) -> np.ndarray:
    """The CVs (8 × N) of the N 1-KiB slices ``data`` holds back to back, slice ``k`` of it being
    BLAKE3 chunk ``slice_indices[k]`` of its trace chunk (the chunk counter)."""
    n = len(slice_indices)
    words = np.frombuffer(data, "<u4").reshape(n, 16, 16)
    cv, counters = np.broadcast_to(KEY, (8, n)), np.asarray(slice_indices, np.uint64)
    for blk in range(16):
        flags = DERIVE_KEY_MATERIAL | (CHUNK_START if blk == 0 else 0) | (CHUNK_END if blk == 15 else 0)
        cv = compress(cv, words[:, blk, :].T, counters, 64, flags)
    return cv


def _parents(left: np.ndarray, right: np.ndarray, flags: int = 0) -> np.ndarray:
    return compress(KEY, np.concatenate([left, right]), 0, 64, PARENT | DERIVE_KEY_MATERIAL | flags)


def _digests(roots: np.ndarray, chunk_indices: Sequence[int]) -> list[bytes]:
    """The chunk digests from each chunk's 64-slice subtree root (8 × N) and its index."""
    tails = np.stack([_words(struct.pack("<Q", i), 1)[0] for i in chunk_indices], axis=1)
    last = compress(KEY, tails, SLICES, 8, CHUNK_START | CHUNK_END | DERIVE_KEY_MATERIAL)
    out = _parents(roots, last, ROOT)
    return [out[:, k].astype("<u4").tobytes() for k in range(out.shape[1])]


def gaps(slices: Sequence[int]) -> list[tuple[int, int]]:
    """(level, index) of the maximal subtrees of the 64-slice tree that hold none of ``slices``,
    left to right: the nodes whose CVs a sliced opening carries."""
    held = set(slices)
    out: list[tuple[int, int]] = []

    def walk(level: int, index: int) -> None:
        first = index << level
        if not any(s in held for s in range(first, first + (1 << level))):
            out.append((level, index))
        elif level:
            walk(level - 1, 2 * index)
            walk(level - 1, 2 * index + 1)

    walk(_DEPTH, 0)
    return out


def sliced_digests(openings: Sequence) -> list[bytes]:
    """The chunk digest each sliced opening (``index``, ``slices``, ``data``, ``cvs``) implies; the
    caller has checked that ``cvs`` has one CV per gap of ``slices`` (:func:`gaps`)."""
    count = len(openings)
    leaves = slice_cvs(b"".join(o.data for o in openings), [s for o in openings for s in o.slices])
    nodes = np.zeros((count, SLICES, 8), _U32)
    at = 0
    for k, o in enumerate(openings):
        nodes[k, list(o.slices)] = leaves[:, at:at + len(o.slices)].T
        at += len(o.slices)
    given = [(k, level, index, cv) for k, o in enumerate(openings) for (level, index), cv in zip(gaps(o.slices), o.cvs)]
    for level in range(_DEPTH):
        for k, lv, index, cv in given:
            if lv == level:
                nodes[k, index] = np.frombuffer(cv, "<u4")
        width = nodes.shape[1] // 2
        flat = nodes.reshape(count * width, 2, 8)
        nodes = _parents(flat[:, 0].T, flat[:, 1].T).T.reshape(count, width, 8)
    return _digests(nodes[:, 0].T, [o.index for o in openings])


def full_tree(chunks: Sequence[bytes]) -> list[list[np.ndarray]]:
    """Every level of the 64-slice tree of each full trace chunk: ``[chunk][level]`` (8 × width)."""
    cvs = slice_cvs(b"".join(chunks), [s for _ in chunks for s in range(SLICES)])
    levels = [cvs.reshape(8, len(chunks), SLICES)]
    while levels[-1].shape[2] > 1:
        prev = levels[-1]
        width = prev.shape[2] // 2
        left, right = prev[:, :, 0::2].reshape(8, -1), prev[:, :, 1::2].reshape(8, -1)
        levels.append(_parents(left, right).reshape(8, len(chunks), width))
    return [[lv[:, k, :] for lv in levels] for k in range(len(chunks))]


def gap_cvs(tree: list[np.ndarray], slices: Sequence[int]) -> tuple[bytes, ...]:
    """The CVs a sliced opening of ``slices`` carries, from the chunk's :func:`full_tree`."""
    return tuple(tree[level][:, index].astype("<u4").tobytes() for level, index in gaps(slices))


def full_digests(chunks: Sequence[bytes], indices: Sequence[int]) -> list[bytes]:
    """Digests of full trace chunks by this tree (the tests' check against the ``blake3`` package)."""
    trees = full_tree(chunks)
    return _digests(np.stack([t[-1][:, 0] for t in trees], axis=1), indices)
