"""Inputs for fuzzing decoders and validators: arbitrary bytes, mutations of valid encodings,
and well-formed, correctly signed messages whose fields are wrong (so that the later rules —
schema, semantics, signature, run consistency — are reached too, not only the first one)."""

from __future__ import annotations

import re
from pathlib import Path

import cbor2
from hypothesis import strategies as st

from open1b.protocol import encode, sign

from ..vectors.common import ident

SPEC = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()
# Every reason code the spec names, in backquotes, anywhere.
SPEC_CODES = set(re.findall(r"`([a-z][a-z_]+)`", SPEC))

scalars = (st.integers(-(2**64), 2**64 - 1) | st.floats() | st.binary(max_size=80) | st.text(max_size=40)
           | st.booleans() | st.none())
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=5)
                      | st.dictionaries(st.text(max_size=12) | st.integers(-5, 5), inner, max_size=5), max_leaves=25)


@st.composite
def raw_cbor(draw) -> bytes:
    """Well-formed CBOR that need not be canonical (cbor2's default encoder), tags included."""
    value = draw(values | st.builds(cbor2.CBORTag, st.integers(0, 300), values))
    return cbor2.dumps(value, canonical=draw(st.booleans()))


@st.composite
def mutated(draw, base: bytes) -> bytes:
    """``base`` with a few random edits: bit flips, cuts, insertions, duplications."""
    data = bytearray(base)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "cut", "insert", "dup", "set"]))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if op == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "cut":
            del data[at:at + draw(st.integers(1, 64))]
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif op == "dup":
            data[at:at] = data[at:at + draw(st.integers(1, 32))]
        elif data:
            data[at] = draw(st.integers(0, 255))
    return bytes(data)


@st.composite
def refielded(draw, message, signer: int) -> bytes:
    """``message`` with one field replaced, dropped or added, re-encoded canonically and signed
    by ``ident(signer)`` over the changed body (the signature is right whenever the key is)."""
    body = {k: v for k, v in cbor2.loads(message.encoded).items() if k != "sig"}
    op = draw(st.sampled_from(["replace", "drop", "add", "swap"]))
    names = sorted(body)
    if op == "replace":
        body[draw(st.sampled_from(names))] = draw(values)
    elif op == "drop":
        del body[draw(st.sampled_from(names))]
    elif op == "add":
        body[draw(st.text(min_size=1, max_size=12))] = draw(values)
    else:  # a field holding another field's value: right type often, wrong meaning
        a, b = draw(st.sampled_from(names)), draw(st.sampled_from(names))
        body[a] = body[b]
    kind = body.get("kind") if isinstance(body.get("kind"), str) else message.KIND
    try:
        return encode({**body, "sig": sign(ident(signer), kind, body)})
    except Exception:  # a body our encoder refuses (NaN keys, …): send it as cbor2 writes it
        return cbor2.dumps({**body, "sig": bytes(64)})


def inputs_for(message, signer: int):
    """Everything a peer might send in place of ``message``."""
    return st.one_of(st.binary(max_size=2048), raw_cbor(), mutated(message.encoded), refielded(message, signer),
                     st.just(message.encoded))
