"""Canonical CBOR: the only byte form in which open1b messages exist.

Encoding is RFC 8949 §4.2 "core deterministic" as produced by ``cbor2.dumps(canonical=True)``:
definite lengths, shortest integer and length heads, floats in the shortest form that keeps
their value, map keys sorted. Our maps only ever have text keys of the same kind, for which
cbor2's length-first order and bytewise order agree.

Decoding is strict: a message is accepted only if re-encoding what was decoded gives back the
exact input bytes. That single check rejects every non-canonical variant (unsorted or duplicate
keys, over-long heads, indefinite lengths, wider floats than needed) without a hand-written
parser. Tags are refused outright, so no decoder hook ever builds an object from peer data.
"""

from __future__ import annotations

from typing import Any

import cbor2

from .errors import DecodeError, NonCanonicalError, OversizeError

_PLAIN_TYPES = (int, float, bytes, str, bool, type(None))

# Nesting bound for decoded values: our schemas are at most three levels deep.
MAX_DEPTH = 8


def encode(value: Any) -> bytes:
    """Canonical CBOR bytes of ``value`` (ints, bytes, text, bools, floats, lists, text-keyed maps)."""
    return cbor2.dumps(value, canonical=True)


def _refuse_tag(decoder: Any, tag: Any) -> Any:
    raise DecodeError(f"CBOR tag {tag.tag} is not allowed")


def decode(data: bytes, *, max_size: int) -> Any:
    """Decode canonical CBOR of at most ``max_size`` bytes, or raise a typed :class:`DecodeError`."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise DecodeError(f"expected bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) > max_size:
        raise OversizeError(f"{len(data)} bytes exceeds the limit of {max_size}")
    try:
        value = cbor2.loads(data, tag_hook=_refuse_tag)
    except DecodeError:
        raise
    except Exception as exc:  # cbor2 raises several types for truncated or garbled input
        raise DecodeError(f"not valid CBOR: {exc}") from exc
    _check_plain(value, 0)
    try:
        again = encode(value)
    except Exception as exc:
        raise NonCanonicalError(f"decoded value cannot be re-encoded: {exc}") from exc
    if again != data:
        raise NonCanonicalError("CBOR is not in canonical form")
    return value


def _check_plain(value: Any, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise DecodeError(f"nesting deeper than {MAX_DEPTH}")
    if type(value) is list:
        for item in value:
            _check_plain(item, depth + 1)
    elif type(value) is dict:
        for key, item in value.items():
            _check_plain(key, depth + 1)
            _check_plain(item, depth + 1)
    elif type(value) not in _PLAIN_TYPES:
        # cbor2 decodes some tags (datetimes, bignums, decimals…) without calling tag_hook.
        raise DecodeError(f"CBOR tag or value of type {type(value).__name__} is not allowed")
