"""A second reading of docs/protocol.md §18.3's sliced opening (r27): the chunk digest its slices
and gap CVs imply, by BLAKE3's tree as the BLAKE3 paper §2 defines it, in plain Python (one
compression at a time; the library's is numpy lanes, protocol/dispute/blake3_tree.py). Used by
``referee_reading.py``; slow (~0.1 ms a compression) but the vectors carry tens of slices."""

from __future__ import annotations

import struct

IV = (0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A, 0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19)
PERMUTATION = (2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8)
CHUNK_START, CHUNK_END, PARENT, ROOT, DERIVE_KEY_CONTEXT, DERIVE_KEY_MATERIAL = 1, 2, 4, 8, 32, 64
M = 0xFFFFFFFF
SLICE, SLICES = 1024, 64


def _rotr(x: int, n: int) -> int:
    return (x >> n) | (x << (32 - n)) & M


def compress(cv, block: bytes, counter: int, block_len: int, flags: int) -> list[int]:
    """The first 8 words of the compression function's output."""
    m = list(struct.unpack("<16I", block.ljust(64, b"\0")))
    v = [*cv, *IV[:4], counter & M, counter >> 32, block_len, flags]

    def g(a, b, c, d, x, y):
        v[a] = (v[a] + v[b] + x) & M
        v[d] = _rotr(v[d] ^ v[a], 16)
        v[c] = (v[c] + v[d]) & M
        v[b] = _rotr(v[b] ^ v[c], 12)
        v[a] = (v[a] + v[b] + y) & M
        v[d] = _rotr(v[d] ^ v[a], 8)
        v[c] = (v[c] + v[d]) & M
        v[b] = _rotr(v[b] ^ v[c], 7)

    for _ in range(7):
        g(0, 4, 8, 12, m[0], m[1])
        g(1, 5, 9, 13, m[2], m[3])
        g(2, 6, 10, 14, m[4], m[5])
        g(3, 7, 11, 15, m[6], m[7])
        g(0, 5, 10, 15, m[8], m[9])
        g(1, 6, 11, 12, m[10], m[11])
        g(2, 7, 8, 13, m[12], m[13])
        g(3, 4, 9, 14, m[14], m[15])
        m = [m[i] for i in PERMUTATION]
    return [v[i] ^ v[i + 8] for i in range(8)]


_CONTEXT = b"open1b/trace/chunk/v2"
KEY = compress(IV, _CONTEXT, 0, len(_CONTEXT), CHUNK_START | CHUNK_END | ROOT | DERIVE_KEY_CONTEXT)


def _words(cv) -> bytes:
    return struct.pack("<8I", *cv)


def _parent(left, right, flags: int = 0) -> list[int]:
    return compress(KEY, _words(left) + _words(right), 0, 64, PARENT | DERIVE_KEY_MATERIAL | flags)


def slice_cv(data: bytes, counter: int) -> list[int]:
    cv = KEY
    for b in range(16):
        flags = DERIVE_KEY_MATERIAL | (CHUNK_START if b == 0 else 0) | (CHUNK_END if b == 15 else 0)
        cv = compress(cv, data[64 * b:64 * (b + 1)], counter, 64, flags)
    return cv


def sliced_digest(index: int, slices: list, data: bytes, cvs: list) -> bytes | None:
    """Chunk ``index``'s digest from its slices and the gaps' CVs (left to right), or None when
    the CVs are not one per gap."""
    held = set(slices)
    leaves = {s: slice_cv(data[k * SLICE:(k + 1) * SLICE], s) for k, s in enumerate(slices)}
    given = iter(cvs)

    def node(level: int, i: int):
        if not held & set(range(i << level, (i + 1) << level)):
            cv = next(given, None)
            if cv is None:
                raise LookupError
            return list(struct.unpack("<8I", cv))
        if level == 0:
            return leaves[i]
        return _parent(node(level - 1, 2 * i), node(level - 1, 2 * i + 1))

    try:
        root = node(6, 0)
    except LookupError:
        return None
    if next(given, None) is not None:
        return None
    tail = compress(KEY, struct.pack("<Q", index), SLICES, 8, CHUNK_START | CHUNK_END | DERIVE_KEY_MATERIAL)
    return _words(_parent(root, tail, ROOT))
