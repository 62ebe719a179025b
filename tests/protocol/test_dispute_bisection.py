"""The descent of docs/protocol.md §18.5 (protocol/dispute/bisection.py): over trees of every size
up to a few hundred leaves, the two parties reach the first leaf at which they differ, each
holding the other's audit path of it, in one round per level with two children; a reveal that
does not hash to the node revealed before is caught; every message is bounded and typed; the
rounds budget is the text's formula (r28)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from open1b.protocol.codec import encode
from open1b.protocol.dispute.bisection import (
    CHUNK_ROUNDS, MAX_CHUNK_MESSAGE, MAX_ROUND_MESSAGE, TRACE_TIMEOUT_S, Descent, decode_message, rounds_budget)
from open1b.protocol.dispute.referee import MAX_OP_TENSOR_BYTES
from open1b.protocol.dispute.trace import TRACE_CHUNK_SIZE
from open1b.protocol.errors import ProtocolError
from open1b.protocol.hashing import blake2b256
from open1b.protocol.merkle import MerkleTree, verify_merkle_proof


def _leaves(n: int, tag: bytes, changed: set[int]) -> list[bytes]:
    return [blake2b256(tag if i in changed else b"same", bytes([i % 256, i // 256])) for i in range(n)]


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 300).flatmap(lambda n: st.tuples(st.just(n), st.sets(st.integers(0, n - 1), min_size=1))))
def test_the_descent_reaches_the_first_differing_leaf_with_both_paths(case):
    n, changed = case
    a, b = MerkleTree(_leaves(n, b"a", changed)), MerkleTree(_leaves(n, b"b", changed))
    da, db = Descent(a, b.root), Descent(b, a.root)
    while not da.done:
        assert not db.done
        left_a, right_a = da.children()
        left_b, right_b = db.children()
        da.step(left_b, right_b)
        db.step(left_a, right_a)
    assert db.done and da.position == db.position == min(changed)
    assert da.rounds == db.rounds <= max(n - 1, 1).bit_length()
    # each holds the other's audit path of the leaf: it verifies against the other's root
    assert list(da.peer_path()) == b.proof(da.position) and list(db.peer_path()) == a.proof(db.position)
    assert verify_merkle_proof(_leaves(n, b"b", changed)[da.position], da.position, n, list(da.peer_path()), b.root)


def test_a_reveal_that_does_not_hash_to_the_node_is_caught():
    a, b = MerkleTree(_leaves(9, b"a", {7})), MerkleTree(_leaves(9, b"b", {7}))
    descent = Descent(a, b.root)
    left, right = MerkleTree(_leaves(9, b"c", {7})).levels[-2][:2]  # a third tree's children
    with pytest.raises(ProtocolError) as caught:
        descent.step(left, right)
    assert caught.value.code == "inconsistent"


def test_agreeing_trees_have_nothing_to_bisect():
    tree = MerkleTree(_leaves(5, b"a", set()))
    with pytest.raises(ValueError):
        Descent(tree, tree.root)


@pytest.mark.parametrize("message,expected,code", [
    ({"t": "children", "left": b"\0" * 32, "right": b"\0" * 32, "extra": 1}, "children", "unknown_field"),
    ({"t": "children", "left": b"\0" * 31, "right": b"\0" * 32}, "children", "wrong_type"),
    ({"t": "record", "record": {}}, "children", "kind"),
    ({"t": "error", "code": "no_such_code"}, "children", "wrong_type"),
    ({"t": "children", "left": b"\0" * 32, "right": b"\0" * (MAX_ROUND_MESSAGE)}, "children", "oversize"),
    ({"t": "chunk", "data": b"\0" * MAX_CHUNK_MESSAGE}, "chunk", "oversize"),
])  # fmt: skip
def test_messages_are_bounded_and_typed(message, expected, code):
    with pytest.raises(ProtocolError) as caught:
        decode_message(encode(message), expected)
    assert caught.value.code == code


def test_an_error_answers_any_message():
    assert decode_message(encode({"t": "error", "code": "busy"}), "children") == {"t": "error", "code": "busy"}


def test_the_rounds_budget_is_the_formula_of_section_18_5():
    # CHUNK_ROUNDS: the rounds down the chunk tree of the largest output the referee judges
    assert CHUNK_ROUNDS == (MAX_OP_TENSOR_BYTES // TRACE_CHUNK_SIZE - 1).bit_length() == 17
    # B(n) = ROUND_TIMEOUT_S + ROUND_PACE_S × (⌈log2 n⌉ + CHUNK_ROUNDS + 3): `tiny`'s 9 levels, gpt-1b's 18
    assert rounds_budget(512) == 60 + 5 * (9 + 20) and rounds_budget(513) == 60 + 5 * (10 + 20)
    assert rounds_budget(205_279) == 250 and rounds_budget(8, round_timeout_s=3, pace_s=1) == 3 + 23
    assert 2 * TRACE_TIMEOUT_S + rounds_budget(205_279) == 7450  # the deadline D(n) at gpt-1b
