"""Merkle trees: the code against RFC 6962's recursive definitions, written out independently."""

import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from open1b.protocol import merkle_proof, merkle_root, verify_merkle_proof
from open1b.protocol.merkle import MerkleTree, leaf_hash


def b2(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=32).digest()


def mth(leaves: list[bytes]) -> bytes:  # RFC 6962 §2.1
    if len(leaves) == 1:
        return b2(b"\x00" + leaves[0])
    k = 1
    while k * 2 < len(leaves):
        k *= 2
    return b2(b"\x01" + mth(leaves[:k]) + mth(leaves[k:]))


def path(m: int, leaves: list[bytes]) -> list[bytes]:  # RFC 6962 §2.1.1
    if len(leaves) == 1:
        return []
    k = 1
    while k * 2 < len(leaves):
        k *= 2
    return path(m, leaves[:k]) + [mth(leaves[k:])] if m < k else path(m - k, leaves[k:]) + [mth(leaves[:k])]


LEAVES = [bytes([i]) * 32 for i in range(70)]


def test_roots_and_proofs_are_rfc6962():
    for n in range(1, len(LEAVES) + 1):
        leaves = LEAVES[:n]
        root = merkle_root(leaves)
        assert root == mth(leaves)
        for i in range(n):
            proof = merkle_proof(leaves, i)
            assert proof == path(i, leaves)
            assert verify_merkle_proof(leaves[i], i, n, proof, root)


def test_a_tree_of_leaf_hashes_hashed_in_parts_is_the_same_tree():
    for n in (1, 2, 5, 70):
        leaves = [leaf_hash(v[:7], v[7:]) for v in LEAVES[:n]]  # a leaf's value hashed in two parts
        tree = MerkleTree.of_leaf_hashes(leaves)
        assert tree.root == mth(LEAVES[:n]) and all(tree.proof(i) == path(i, LEAVES[:n]) for i in range(n))


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 40), data=st.data())
def test_any_change_to_a_proof_fails(n, data):
    leaves = LEAVES[:n]
    root, i = merkle_root(leaves), data.draw(st.integers(0, n - 1))
    proof = merkle_proof(leaves, i)
    change = data.draw(st.sampled_from(["index", "leaf", "sibling", "drop", "extra"] if proof else ["index", "leaf", "extra"]))
    leaf, index = leaves[i], i
    if change == "index":
        index = data.draw(st.integers(0, n).filter(lambda j: j != i))
    elif change == "leaf":
        leaf = b2(leaf)
    elif change == "sibling":
        j = data.draw(st.integers(0, len(proof) - 1))
        proof[j] = b2(proof[j])
    elif change == "drop":
        proof.pop()
    else:
        proof.append(root)
    assert not verify_merkle_proof(leaf, index, n, proof, root)


def test_the_last_leaf_proof_binds_the_tree_size():
    # (a proof binds the size only through its shape: the root is what commits to the size)
    for n in range(1, 41):
        leaves = LEAVES[:n]
        proof = merkle_proof(leaves, n - 1)
        assert not verify_merkle_proof(leaves[-1], n - 1, n + 1, proof, merkle_root(leaves))
