"""What every vector suite shares: the JSON conventions of tests/vectors/README.md.

* byte strings are ``"0x"``-prefixed lowercase hex;
* a CBOR value is written as *typed JSON*, so that no JSON parser can round or retype it:
  ``{"uint": "5"}``, ``{"nint": "-5"}`` (decimal strings), ``{"float": "0x3ff8000000000000"}``
  (the IEEE 754 binary64 bits of the value), ``{"bytes": "0x…"}``, ``{"text": "…"}``,
  ``{"bool": true}``, ``{"null": null}``, ``{"array": [...]}``, ``{"map": [[key, value], ...]}``
  (pairs in canonical order);
* identities are derived, never random: seed n = B2("open1b/test-vector/seed" ‖ u8(n)).
"""

from __future__ import annotations

import json
import struct
from typing import Any

from open1b.protocol import Identity, blake2b256

NOW = 1_800_000_000


def hx(data: bytes) -> str:
    return "0x" + bytes(data).hex()


def unhex(text: str) -> bytes:
    assert text.startswith("0x"), text
    return bytes.fromhex(text[2:])


def seed(n: int) -> bytes:
    return blake2b256(b"open1b/test-vector/seed", bytes([n]))


def ident(n: int) -> Identity:
    return Identity(seed(n))


def typed(value: Any) -> Any:
    """A decoded CBOR value as typed JSON (maps in canonical key order)."""
    if value is None:
        return {"null": None}
    if type(value) is bool:
        return {"bool": value}
    if type(value) is int:
        return {"uint": str(value)} if value >= 0 else {"nint": str(value)}
    if type(value) is float:
        return {"float": hx(struct.pack(">d", value))}
    if type(value) is bytes:
        return {"bytes": hx(value)}
    if type(value) is str:
        return {"text": value}
    if type(value) is list:
        return {"array": [typed(v) for v in value]}
    if type(value) is dict:
        from open1b.protocol import encode

        items = sorted(value.items(), key=lambda kv: (len(encode(kv[0])), encode(kv[0])))
        return {"map": [[typed(k), typed(v)] for k, v in items]}
    raise TypeError(f"no typed JSON for {type(value).__name__}")


def untyped(node: Any) -> Any:
    (kind, inner), = node.items()
    if kind == "null":
        return None
    if kind == "bool":
        return inner
    if kind in ("uint", "nint"):
        return int(inner)
    if kind == "float":
        return struct.unpack(">d", unhex(inner))[0]
    if kind == "bytes":
        return unhex(inner)
    if kind == "text":
        return inner
    if kind == "array":
        return [untyped(v) for v in inner]
    if kind == "map":
        return {untyped(k): untyped(v) for k, v in inner}
    raise ValueError(f"unknown typed JSON kind {kind!r}")


def dump(case: dict) -> bytes:
    """The one byte form of a case file: sorted keys, one-space indent, trailing newline."""
    return (json.dumps(case, indent=1, sort_keys=True, ensure_ascii=False) + "\n").encode()
