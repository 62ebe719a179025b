"""The bisection of docs/protocol.md §18.5: two parties descend their Merkle trees (the trace
tree, then one output's chunk tree) to the first leaf at which they differ, one level a round.

A tree of n leaves has the RFC 6962 shape of :mod:`..merkle`: node (level j, index i) covers
leaves ``[i·2^j, min((i+1)·2^j, n))``, and a node without a right child is its left child
promoted unchanged. Both parties' trees have the same shape (the same n), so a :class:`Descent`
walks (j, i) from the root: a node with two children is a round (each party reveals its two
child hashes, each checks the other's against the hash it revealed before, and both move to
the leftmost child whose hashes differ); a promoted node costs no round. At a leaf, each party
holds the other's audit path (the siblings it revealed on the way), which a fraud proof carries.

Messages are canonical CBOR maps ``{"t": type, …}``, each at most its type's bound, read with
:func:`decode_message` before anything else looks at them.
"""

from __future__ import annotations

from typing import Any

from ..codec import decode
from ..errors import ProtocolError, WrongTypeError
from ..merkle import MerkleTree, node_hash
from ..messages import HASH_SIZE
from ..schema import Bytes, Enum, check_map
from .trace import MAX_TRACE_SIZE, STATE_CHUNK_SIZE, TRACE_CHUNK_SIZE

DISPUTE_PROTOCOL = "/open1b/dispute/1.0.0"
MAX_ROUND_MESSAGE = 256
"""Bytes of a round (two hashes) and of the small messages (``agree``, ``error``)."""
MAX_RECORD_MESSAGE = 16384
"""Bytes of a record message: a ``clip`` record names one input per parameter (gpt-1b: 112)."""
MAX_CHUNK = max(TRACE_CHUNK_SIZE, STATE_CHUNK_SIZE)
"""Bytes of the largest chunk: an output of the update is chunked as the state tree is (§18.1)."""
MAX_CHUNK_MESSAGE = MAX_CHUNK + 64
"""Bytes of a chunk message: the chunk (its path is what the descent to it revealed)."""
ROUND_TIMEOUT_S = 60.0
"""A party that does not answer a round within this loses the dispute on the node that waited."""
ROUND_PACE_S = 5.0
"""An honest party's pace per exchange: two hashes it holds and a round trip (~30 ms on loopback)."""
TRACE_TIMEOUT_S = 3600.0
"""How long a party may take for a traced replay (its trace, or its op data): ``ANSWER_SECONDS``."""
CHUNK_ROUNDS = 17
"""Rounds down the largest output's chunk tree: ⌈log2(MAX_OP_TENSOR_BYTES / TRACE_CHUNK_SIZE)⌉."""


def rounds_budget(ops: int, *, round_timeout_s: float = ROUND_TIMEOUT_S, pace_s: float = ROUND_PACE_S) -> float:
    """The time a party's exchanges other than its two traced replays take together, at most
    (§18.5): each of ⌈log2 ops⌉ + ``CHUNK_ROUNDS`` + 3 at the pace, and one round timeout besides."""
    return round_timeout_s + pace_s * ((ops - 1).bit_length() + CHUNK_ROUNDS + 3)

ERRORS = ("busy", "no_trace", "not_disputed")

class _Checked:
    """A field the caller checks (a record: :func:`.proof.check_record`)."""

    def check(self, name: str, value: Any) -> None:
        if type(value) is not dict:
            raise WrongTypeError(f"{name}: expected a map")


_HASH = Bytes(size=HASH_SIZE)
_SCHEMAS: dict[str, tuple[int, dict]] = {
    "trace": (MAX_TRACE_SIZE + 64, {"trace": Bytes(max_size=MAX_TRACE_SIZE)}),
    "children": (MAX_ROUND_MESSAGE, {"left": _HASH, "right": _HASH}),
    "record": (MAX_RECORD_MESSAGE, {"record": _Checked()}),
    "chunk": (MAX_CHUNK_MESSAGE, {"data": Bytes(max_size=MAX_CHUNK)}),
    "error": (MAX_ROUND_MESSAGE, {"code": Enum(frozenset(ERRORS))}),
}  # fmt: skip
MAX_MESSAGE = max(bound for bound, _ in _SCHEMAS.values())


def decode_message(data: bytes, expected: str) -> dict:
    """The message ``data`` if it is a canonical ``expected`` (or an ``error``) within its bound;
    a typed ProtocolError (code ``oversize``, ``malformed``, ``kind``, …) otherwise."""
    kind = expected if expected in _SCHEMAS else "error"
    value = decode(data, max_size=max(_SCHEMAS[kind][0], MAX_ROUND_MESSAGE))
    if type(value) is not dict or value.get("t") not in (expected, "error"):
        raise WrongTypeError(f"expected a {expected} message, got {value.get('t') if type(value) is dict else value!r}",
                             code="kind")
    bound, schema = _SCHEMAS[value["t"]]
    if len(data) > bound:
        raise ProtocolError(f"a {value['t']} message of {len(data)} bytes (at most {bound})", code="oversize")
    check_map({"t": Enum(frozenset({value["t"]})), **schema}, value, f"dispute {value['t']}")
    return value


class Descent:
    """One party's walk down its ``tree`` against the other's revealed hashes (module doc).
    ``peer_root`` is the other's root, which its signed trace committed."""

    def __init__(self, tree: MerkleTree, peer_root: bytes) -> None:
        if tree.root == peer_root:
            raise ValueError("the trees agree: nothing to bisect")
        self.tree = tree
        self.level, self.index = len(tree.levels) - 1, 0
        self.peer_hash = peer_root
        self.peer_siblings: list[bytes] = []  # from the root down
        self.rounds = 0
        self._skip_promoted()

    def _skip_promoted(self) -> None:
        while self.level > 0 and 2 * self.index + 1 >= len(self.tree.levels[self.level - 1]):
            self.level, self.index = self.level - 1, 2 * self.index

    @property
    def done(self) -> bool:
        return self.level == 0

    @property
    def position(self) -> int:
        """The leaf the descent reached (when :attr:`done`)."""
        return self.index

    def children(self) -> tuple[bytes, bytes]:
        """This party's two child hashes of the current node: what it reveals this round."""
        below = self.tree.levels[self.level - 1]
        return below[2 * self.index], below[2 * self.index + 1]

    def step(self, left: bytes, right: bytes) -> None:
        """Take the other party's children of the current node; move to the leftmost child at
        which the two trees differ. ProtocolError (``inconsistent``) when they do not hash to
        the node the other revealed before, which its signed root binds it to."""
        if node_hash(left, right) != self.peer_hash:
            raise ProtocolError("the revealed children do not hash to the revealed node", code="inconsistent")
        mine = self.children()
        go_right = mine[0] == left
        self.peer_hash, sibling = (right, left) if go_right else (left, right)
        self.peer_siblings.append(sibling)
        self.level, self.index = self.level - 1, 2 * self.index + int(go_right)
        self.rounds += 1
        self._skip_promoted()

    def peer_path(self) -> tuple[bytes, ...]:
        """The other party's audit path of :attr:`position` (leaf level up), from its reveals."""
        return tuple(reversed(self.peer_siblings))
