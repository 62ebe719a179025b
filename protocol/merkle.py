"""Merkle trees over a list of 32-byte values, shaped as in RFC 6962 (Certificate Transparency)
but hashed with BLAKE2b-256:

    leaf(x)    = B2(0x00 ‖ x)
    node(l, r) = B2(0x01 ‖ l ‖ r)
    MTH([x])   = leaf(x)
    MTH(D[n])  = node(MTH(D[0:k]), MTH(D[k:n]))   with k the largest power of two < n

The 0x00/0x01 prefixes keep an inner node from passing as a leaf. This shape equals the
bottom-up construction in which an odd node at the end of a level is promoted unchanged (the
rule Open-1B's receipts use), so a proof has no entry for the levels a node was promoted
through. A proof is the RFC 6962 audit path, checked with the RFC 9162 §2.1.3.2 algorithm.
"""

from __future__ import annotations

from typing import Sequence

from .hashing import blake2b256

_LEAF = b"\x00"
_NODE = b"\x01"


def leaf_hash(value: bytes) -> bytes:
    return blake2b256(_LEAF, value)


def node_hash(left: bytes, right: bytes) -> bytes:
    return blake2b256(_NODE, left, right)


def _split(n: int) -> int:
    return 1 << ((n - 1).bit_length() - 1)


def _root_of(hashes: Sequence[bytes]) -> bytes:
    level = list(hashes)
    while len(level) > 1:  # pair left to right; an odd last node rises unchanged
        paired = [node_hash(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        level = paired + ([level[-1]] if len(level) % 2 else [])
    return level[0]


def merkle_root(values: Sequence[bytes]) -> bytes:
    if not values:
        raise ValueError("a Merkle tree needs at least one leaf")
    return _root_of([leaf_hash(v) for v in values])


def merkle_proof(values: Sequence[bytes], index: int) -> list[bytes]:
    """The audit path of leaf ``index``: sibling subtree roots, from the leaf level up."""
    if not 0 <= index < len(values):
        raise ValueError(f"leaf index {index} outside a tree of {len(values)}")

    def path(m: int, hashes: list[bytes]) -> list[bytes]:
        if len(hashes) == 1:
            return []
        k = _split(len(hashes))
        if m < k:
            return path(m, hashes[:k]) + [_root_of(hashes[k:])]
        return path(m - k, hashes[k:]) + [_root_of(hashes[:k])]

    return path(index, [leaf_hash(v) for v in values])


def verify_merkle_proof(value: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes) -> bool:
    """True if ``value`` is leaf ``index`` of the ``size``-leaf tree with ``root``."""
    if not 0 <= index < size:
        return False
    fn, sn, r = index, size - 1, leaf_hash(value)
    for sibling in proof:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(sibling, r)
            while not fn & 1 and fn != 0:
                fn, sn = fn >> 1, sn >> 1
        else:
            r = node_hash(r, sibling)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and r == root
