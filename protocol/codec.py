"""Canonical CBOR: the only byte form in which open1b messages exist.

Encoding is RFC 8949 §4.2 "core deterministic" as produced by ``cbor2.dumps(canonical=True)``:
definite lengths, shortest integer and length heads, floats in the shortest form that keeps
their value, map keys sorted. Map keys are text only (docs/protocol.md §3.1), for which cbor2's
length-first order and the bytewise order of the encodings agree.

Decoding is strict, in two passes. A structural scan (:func:`_scan`) refuses what no message
may contain — tags, simple values other than false/true/null, map keys that are not text,
nesting deeper than :data:`MAX_DEPTH`, bytes after the data item, truncation — reading the heads
in byte order so that the first defect decides the reason code (§3.2), before any object is built, so no
decoder hook ever constructs anything from peer data (cbor2 decodes some tags natively). Then
the value is decoded and must re-encode to the exact input bytes: that single check rejects every
non-canonical variant (unsorted or duplicate keys, over-long heads, indefinite lengths, wider
floats than needed) without a hand-written canonical-form checker. The re-encoding is compared
with the input a piece at a time as it is produced (:func:`_encodes_to`), never built whole: for
a message of large byte strings (a fraud proof: up to 128 MiB) a whole re-encoding would hold a
second copy of the message beside the input and the decoded value.
"""

from __future__ import annotations

from itertools import chain
from typing import Any, Iterable, Iterator

import cbor2

from .errors import DecodeError, NonCanonicalError, OversizeError

# Nesting bound: no array or map lies inside this many others (a scalar may lie inside 8).
MAX_DEPTH = 8
_SIMPLE_OK = {20, 21, 22, 25, 26, 27}  # false, true, null, float16/32/64


def encode(value: Any) -> bytes:
    """Canonical CBOR bytes of ``value`` (ints, bytes, text, bools, floats, lists, text-keyed maps).
    Text keys sort shorter first, then bytewise: cbor2's order, and the bytewise order of their
    encodings (a text key's head holds its length)."""
    return cbor2.dumps(value, canonical=True)


def _scan(data: bytes, max_items: int | None = None) -> None:
    """Check that ``data`` is exactly one well-formed CBOR item of the allowed kinds
    (docs/protocol.md §3.2 step 2: heads in byte order, the first defect decides), holding at
    most ``max_items`` heads when that is given."""
    pos, size, items = 0, len(data), 0
    # Items still to read in each open container, and whether it is a map (the outermost
    # "container" holds the one data item).
    pending, in_map = [1], [False]
    while pending:
        if pending[-1] == 0:
            pending.pop()
            in_map.pop()
            continue
        is_key = in_map[-1] and pending[-1] % 2 == 0
        pending[-1] -= 1
        items += 1
        if max_items is not None and items > max_items:
            raise OversizeError(f"more than {max_items} CBOR items")
        if pos >= size:
            raise DecodeError("truncated CBOR")
        major, info = data[pos] >> 5, data[pos] & 31
        pos += 1
        if info == 31:
            raise NonCanonicalError("indefinite-length item")
        if info > 27:
            raise DecodeError("reserved CBOR additional information")
        arg = info
        if info >= 24:
            width = 1 << (info - 24)
            if pos + width > size:
                raise DecodeError("truncated CBOR")
            arg, pos = int.from_bytes(data[pos:pos + width], "big"), pos + width
        if is_key and major != 3:
            raise DecodeError("map keys must be text strings")
        if major == 6:
            raise DecodeError("CBOR tags are not allowed")
        if major == 7 and info not in _SIMPLE_OK:
            raise DecodeError(f"CBOR simple value {arg} is not allowed")
        if major in (2, 3):
            pos += arg
            if pos > size:
                raise DecodeError("truncated CBOR")
        elif major in (4, 5):
            # this array or map would lie inside len(pending) - 1 others
            if len(pending) > MAX_DEPTH:
                raise DecodeError(f"nesting deeper than {MAX_DEPTH}")
            pending.append(arg if major == 4 else 2 * arg)
            in_map.append(major == 5)
    if pos != size:
        raise DecodeError("bytes after the data item")


def decode(data: bytes, *, max_size: int, max_items: int | None = None) -> Any:
    """Decode canonical CBOR of at most ``max_size`` bytes (and ``max_items`` data items, counted
    before any object is built: a large message of tiny items would otherwise cost far more
    memory than its size), or raise a typed :class:`DecodeError`."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise DecodeError(f"expected bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) > max_size:
        raise OversizeError(f"{len(data)} bytes exceeds the limit of {max_size}")
    _scan(data, max_items)
    try:
        value = cbor2.loads(data)
    except Exception as exc:  # e.g. a text string that is not UTF-8
        raise DecodeError(f"not valid CBOR: {exc}") from exc
    try:
        canonical = _encodes_to(value, data)
    except Exception as exc:
        raise NonCanonicalError(f"decoded value cannot be re-encoded: {exc}") from exc
    if not canonical:
        raise NonCanonicalError("CBOR is not in canonical form")
    return value


def _head(major: int, n: int) -> bytes:
    """The shortest head of major type ``major`` with argument ``n``."""
    if n < 24:
        return bytes((major << 5 | n,))
    width = 0 if n < 1 << 8 else 1 if n < 1 << 16 else 2 if n < 1 << 32 else 3
    return bytes((major << 5 | 24 + width,)) + n.to_bytes(1 << width, "big")


_HEADS = [[_head(major, n) for n in range(256)] for major in range(6)]  # the frequent heads, made once
_TEXT_PIECE = 1 << 16  # characters of a longer text encoded at a time
_END = object()


def _utf8(text: str) -> Iterator[bytes]:
    return (text[i:i + _TEXT_PIECE].encode() for i in range(0, len(text), _TEXT_PIECE))


def _key_order(entry: tuple[str, Any]) -> tuple[int, bytes]:
    key = entry[0].encode()
    return len(key), key


def _encodes_to(value: Any, data: bytes) -> bool:
    """Whether ``encode(value) == data``, compared in encoding order a piece at a time: each head,
    number or short text as encoded, a byte string's bytes where they lie (``bytes.startswith``
    at an offset copies nothing), a long text 64 Ki characters at a time; so the check holds at
    most a few hundred KiB besides ``value`` and ``data``, and one iterator per open container. Arrays and maps
    are laid out as cbor2's canonical form lays them out (shortest heads; a map's entries by the
    encodings of their text keys, shorter first, then bytewise); every other scalar is cbor2's own
    encoding of it."""
    starts, pos, open_items = data.startswith, 0, [iter((value,))]
    while open_items:
        item = next(open_items[-1], _END)
        if item is _END:
            open_items.pop()
            continue
        kind = type(item)
        if kind is bytes:  # the most frequent item (hashes), so checked here without a loop
            head = _HEADS[2][len(item)] if len(item) < 256 else _head(2, len(item))
            if not (starts(head, pos) and starts(item, pos + len(head))):
                return False
            pos += len(head) + len(item)
            continue
        if kind is int and -256 < item < 256:
            pieces: Iterable[bytes] = (_HEADS[0][item] if item >= 0 else _HEADS[1][~item],)
        elif kind is list:
            pieces = (_HEADS[4][len(item)] if len(item) < 256 else _head(4, len(item)),)
            open_items.append(iter(item))
        elif kind is dict:
            pieces = (_head(5, len(item)),)
            open_items.append(chain.from_iterable(sorted(item.items(), key=_key_order)))
        elif kind is str and len(item) <= _TEXT_PIECE:
            body = item.encode()
            pieces = (_head(3, len(body)), body)
        elif kind is str:
            pieces = chain((_head(3, sum(map(len, _utf8(item)))),), _utf8(item))
        else:  # floats (their shortest exact form), false, true, null, other integers
            pieces = (cbor2.dumps(item, canonical=True),)
        for piece in pieces:
            if not starts(piece, pos):
                return False
            pos += len(piece)
    return pos == len(data)
