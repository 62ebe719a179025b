"""What a fraud proof carries of an op's inputs (docs/protocol.md §18.2–§18.3): the disputed
element, the chunks its row reads, and of an input over 8 MiB (r27) the elements it reads, in
1 KiB slices of its trace chunks. No numpy.

An input of at most :data:`SLICED_INPUT_BYTES` is carried as before r27: whole chunks, those the
disputed row reads (:func:`needed_chunks`). A larger one is read by *elements*: a product's
disputed element (b, i, j) reads row i of op(a) and column j of op(b) in batch b alone, a column
sum's element c column c alone, every other kind the rows §18.2 names. A column crosses every row,
so at `gpt-1b` a weight gradient's row-level read was all of two 64-256 MiB operands, over
``MAX_FRAUD_PROOF_SIZE``; its elements are one per row. The chunks holding those elements are
opened whole where the input is from the state (1 MiB BLAKE2b chunks, which have no inner tree),
where the chunk is short (a tensor's last), or where the elements touch each of its 64 slices;
otherwise by the slices they touch (:class:`SlicedOpening`, proven by BLAKE3's own tree,
:mod:`.blake3_tree`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ..commitments import ITEMSIZE
from ..errors import WrongTypeError
from ..schema import Bytes, ListOf, UInt
from .ops import WHOLE, input_rows, rows_of
from .trace import TRACE_CHUNK_SIZE, chunk_count, chunk_size, nbytes

SLICED_INPUT_BYTES = 8 << 20
"""Bytes above which an input is read by elements (module doc). Every input at `small` is below it,
so its proofs are those of r26; a slice costs the referee 16 compressions in numpy lanes."""
SLICE_SIZE = 1024
SLICES = TRACE_CHUNK_SIZE // SLICE_SIZE


@dataclass(frozen=True)
class SlicedOpening:
    """Slices ``slices`` (ascending) of full trace chunk ``index``: their bytes back to back, the
    CVs of the maximal slice subtrees holding none of them (left to right), and the chunk's path
    in the tensor's chunk tree."""

    index: int
    slices: tuple[int, ...]
    data: bytes
    cvs: tuple[bytes, ...]
    path: tuple[bytes, ...]

    def to_cbor(self) -> list:
        return [self.index, list(self.slices), self.data, list(self.cvs), list(self.path)]


_HASH = Bytes(size=32)


def check_sliced(name: str, value: Any, path_schema) -> None:
    """The schema of a sliced opening ``[index, [slice…], bytes, [cv…], [hash…]]``."""
    UInt(maximum=(1 << 32) - 1).check(name, value[0])
    ListOf(UInt(maximum=SLICES - 1), SLICES - 1).check(name, value[1])
    Bytes(max_size=(SLICES - 1) * SLICE_SIZE).check(name, value[2])
    ListOf(_HASH, SLICES - 1).check(name, value[3])
    path_schema.check(name, value[4])
    if not value[1] or len(value[2]) != SLICE_SIZE * len(value[1]):
        raise WrongTypeError(f"{name}: at least one slice, {SLICE_SIZE} bytes each")


def sliced_opening(value: list) -> SlicedOpening:
    return SlicedOpening(value[0], tuple(value[1]), value[2], tuple(value[3]), tuple(value[4]))


def _first_difference(a: bytes, b: bytes) -> int:
    """The first byte at which ``a`` and ``b`` (equal lengths, not equal) differ, by bisection of
    memcmp-ed slices: a Python loop over a 1 MiB chunk's 2^18 elements took milliseconds."""
    lo, hi = 0, len(a)  # a[:lo] == b[:lo], and they differ in [lo, hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def disputed_element(shape: Sequence[int], chunk: int, a: bytes, b: bytes, *, state: bool) -> tuple[int, int]:
    """(element, row) that a dispute over chunk ``chunk`` of a float32 output of ``shape`` is about
    (``state``: one chunked as the state is, :func:`.trace.state_output`): the first element at which
    the parties' chunk bytes ``a`` and ``b`` (equal lengths) differ, and its row. Only that row is
    re-executed: one wrong element convicts its party, whatever the rest of its chunk holds."""
    first = _first_difference(a, b) // 4
    element = chunk * (chunk_size(state=state) // 4) + first
    return element, element // rows_of(tuple(shape))[1]


def needed_chunks(entry: dict, how: str, row: int, attrs: dict) -> list[int]:
    """The chunk indices of input ``entry`` (a record's input) that output row ``row`` reads
    ``how``, ascending, each once."""
    state = "state" in entry
    total = nbytes(entry["dtype"], entry["shape"])
    if how == WHOLE:
        return list(range(chunk_count(total, state=state)))
    width = rows_of(tuple(entry["shape"]))[1] * ITEMSIZE[entry["dtype"]]
    size = chunk_size(state=state)
    return sorted({c for r in input_rows(how, row, attrs) for c in range(r * width // size, -(-(r + 1) * width // size))})


def read_by_elements(entry: dict) -> bool:
    """Whether input ``entry`` (a record's) is read by elements (module doc)."""
    return nbytes(entry["dtype"], entry["shape"]) > SLICED_INPUT_BYTES


def _batched(shape: Sequence[int]) -> tuple[int, int, int]:
    return tuple(shape) if len(shape) == 3 else (1, *shape)  # type: ignore[return-value]


def element_reads(kind: str, which: int, entry: dict, how: str, attrs: dict, out_shape: Sequence[int],
                  element: int) -> list[tuple[int, int, int]]:
    """The elements of input ``which`` (``entry``, read ``how``) that output element ``element``
    (of ``out_shape``) reads, as runs (start, stride, count) of the input's flat elements: a row is
    (start, 1, width), a column (first, row width, rows)."""
    shape = tuple(entry["shape"])
    _, out_width = rows_of(tuple(out_shape))
    row, col = divmod(element, out_width)
    if kind == "matmul":
        batch, d1, d2 = _batched(shape)
        base = (row // _batched(out_shape)[1]) * d1 * d2
        i = row % _batched(out_shape)[1]
        along = attrs["trans_a"] if which == 0 else not attrs["trans_b"]  # the operand's K runs down its rows
        index = i if which == 0 else col
        return [(base + index, d2, d1)] if along else [(base + index * d2, 1, d2)]
    n, width = rows_of(shape)
    if kind == "sum_rows":  # output element c (a 1-D output: its rows are its elements) is column c's sum
        return [(element, width, n)]
    if how == WHOLE:
        return [(0, 1, n * width)]
    return [(r * width, 1, width) for r in sorted(set(input_rows(how, row, attrs)))]


def _spans(runs: Sequence[tuple[int, int, int]], item: int, unit: int):
    """Byte spans [b0, b1) covering the elements of ``runs`` at the granularity ``unit``: a run
    whose elements lie less than ``unit`` apart touches every unit between its first and last, so
    it is one span; otherwise each element is its own."""
    for start, stride, count in runs:
        if count == 1 or stride * item < unit:
            yield start * item, (start + (count - 1) * stride + 1) * item
        else:
            for k in range(count):
                yield (start + k * stride) * item, (start + k * stride + 1) * item


def plan(entry: dict, runs: Sequence[tuple[int, int, int]],
         limit: int | None = None) -> list[tuple[int, tuple[int, ...] | None]] | None:
    """The openings a proof carries of input ``entry`` read by elements ``runs``: (chunk index,
    its slices, or None for a whole chunk), ascending (module doc). None as soon as more than
    ``limit`` chunks are touched: a referee stops where the proof cannot hold the plan, so a
    record naming a huge column costs it at most ~64 steps per opening the proof carries."""
    item, total, state = ITEMSIZE[entry["dtype"]], nbytes(entry["dtype"], entry["shape"]), "state" in entry
    size = chunk_size(state=state)
    unit = size if state else SLICE_SIZE
    per = size // unit
    touched: dict[int, set[int] | None] = {}  # chunk: its touched slices, None for all
    for b0, b1 in _spans(runs, item, unit):
        g0, g1 = b0 // unit, (b1 - 1) // unit
        for c in range(g0 // per, g1 // per + 1):
            lo, hi = max(g0, c * per) - c * per, min(g1, c * per + per - 1) - c * per
            if hi - lo + 1 == per:
                touched[c] = None
            elif touched.get(c, ()) is not None:
                touched.setdefault(c, set()).update(range(lo, hi + 1))  # type: ignore[union-attr]
            if limit is not None and len(touched) > limit:
                return None
    full = total // TRACE_CHUNK_SIZE  # chunks before this one are full
    return [(c, None if state or sl is None or c >= full or len(sl) == SLICES else tuple(sorted(sl)))
            for c, sl in sorted(touched.items())]
