"""Properties of the strict decoder: canonical values round-trip, arbitrary bytes only ever give a
typed ProtocolError, and no single-byte change to a signed message decodes."""

import math

import cbor2
from hypothesis import example, given, settings
from hypothesis import strategies as st

from open1b.protocol import Attestation, ProtocolError, decode, encode
from open1b.protocol.codec import _scan
from open1b.protocol.errors import NonCanonicalError

from .conftest import ident, make_attestation, make_manifest

scalars = (st.integers(-(2**64), 2**64 - 1) | st.floats(allow_nan=False) | st.binary(max_size=40)
           | st.text(max_size=20) | st.booleans() | st.none())
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                      max_leaves=20)


def depth(v) -> int:
    if isinstance(v, list):
        return 1 + max(map(depth, v), default=0)
    if isinstance(v, dict):
        return 1 + max(map(depth, v.values()), default=0)
    return 0


@settings(max_examples=400, deadline=None)
@given(values)
def test_canonical_values_round_trip(value):
    data = encode(value)
    if depth(value) > 8:
        return
    again = decode(data, max_size=len(data))
    assert encode(again) == data
    if not (isinstance(value, float) and math.isnan(value)):
        assert again == value


@settings(max_examples=1000, deadline=None)
@given(st.binary(max_size=64))
def test_arbitrary_bytes_give_a_value_or_a_typed_error(data):
    try:
        value = decode(data, max_size=64)
    except ProtocolError as exc:
        assert exc.code in {"malformed", "non_canonical", "oversize"}
        return
    assert encode(value) == data


MESSAGE = make_attestation(ident(1), make_manifest(ident(0)), 1).encoded


@settings(max_examples=500, deadline=None)
@given(st.integers(0, len(MESSAGE) - 1), st.integers(1, 255))
def test_no_single_byte_change_to_a_signed_message_decodes(position, xor):
    mutated = bytearray(MESSAGE)
    mutated[position] ^= xor
    try:
        Attestation.decode(bytes(mutated))
    except ProtocolError:
        return
    raise AssertionError(f"a changed byte at {position} still decoded")


def _whole_re_encoding_matches(value, data: bytes) -> bool:
    """The canonical check as it was first written: the whole re-encoding equals the input."""
    try:
        return encode(value) == data
    except Exception:
        return False


@settings(max_examples=600, deadline=None)
@given(values, st.booleans(), st.integers(0, 1 << 16), st.integers(0, 255))
@example({"é": 1, "ab": [b"", -24, 1.0e300], "c": {"": None, "a": True}}, False, 0, 0)  # keys: 1 char, 2 bytes
@example([b"\x01" * 300, b"\x02" * 70_000, "z" * 300, [0] * 300, "é" * 70_000, 1 << 40, -(1 << 40)], True, 0, 0)  # longer heads
def test_the_piecewise_check_agrees_with_a_whole_re_encoding(value, canonical, position, xor):
    """decode, whose check compares as it re-encodes (codec._encodes_to), accepts exactly what
    comparing the whole re-encoding accepted: canonical encodings, cbor2's non-canonical ones
    (keys in insertion order, floats as float64) and either with one byte changed, wherever the
    structural scan passes them and cbor2 decodes them."""
    data = bytearray(cbor2.dumps(value, canonical=canonical))
    data[position % len(data)] ^= xor
    try:
        _scan(bytes(data))
        decoded = cbor2.loads(bytes(data))
    except (ProtocolError, cbor2.CBORDecodeError):
        return
    try:
        decode(bytes(data), max_size=len(data))
    except NonCanonicalError:
        assert not _whole_re_encoding_matches(decoded, bytes(data))
        return
    assert _whole_re_encoding_matches(decoded, bytes(data))
