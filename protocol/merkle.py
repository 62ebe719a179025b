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


def leaf_hash(*value: bytes) -> bytes:
    """The leaf hash of the concatenation of ``value``'s parts (hashed in place, not joined)."""
    return blake2b256(_LEAF, *value)


def node_hash(left: bytes, right: bytes) -> bytes:
    return blake2b256(_NODE, left, right)


class MerkleTree:
    """Every level of the tree over ``values``, built once, so that each audit path costs a
    lookup per level instead of a rebuild (a data proof lists hundreds of samples of one tree).

    Levels pair nodes left to right and promote an odd last node unchanged: the RFC 6962 shape
    (module doc), so a promoted node's level contributes no sibling to a path."""

    def __init__(self, values: Sequence[bytes]) -> None:
        self._grow([leaf_hash(v) for v in values])

    @classmethod
    def of_leaf_hashes(cls, leaves: Sequence[bytes]) -> "MerkleTree":
        """The tree whose leaf hashes are ``leaves`` (:func:`leaf_hash` of each value), for a
        caller that hashed its leaves elsewhere (in parallel, or from views of its buffers)."""
        tree = cls.__new__(cls)
        tree._grow(list(leaves))
        return tree

    def _grow(self, level: list[bytes]) -> None:
        if not level:
            raise ValueError("a Merkle tree needs at least one leaf")
        self.levels = [level]
        while len(level) > 1:
            paired = [node_hash(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
            level = paired + ([level[-1]] if len(level) % 2 else [])
            self.levels.append(level)

    @property
    def size(self) -> int:
        return len(self.levels[0])

    @property
    def root(self) -> bytes:
        return self.levels[-1][0]

    def proof(self, index: int) -> list[bytes]:
        """The audit path of leaf ``index``: sibling subtree roots, from the leaf level up."""
        if not 0 <= index < self.size:
            raise ValueError(f"leaf index {index} outside a tree of {self.size}")
        path = []
        for level in self.levels[:-1]:
            if index ^ 1 < len(level):  # no sibling: the node is promoted unchanged
                path.append(level[index ^ 1])
            index >>= 1
        return path


def merkle_root(values: Sequence[bytes]) -> bytes:
    return MerkleTree(values).root


def merkle_proof(values: Sequence[bytes], index: int) -> list[bytes]:
    """The audit path of leaf ``index``: sibling subtree roots, from the leaf level up."""
    return MerkleTree(values).proof(index)


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
