import cbor2
import pytest

from open1b.protocol import codec
from open1b.protocol.errors import DecodeError, NonCanonicalError, OversizeError


def test_roundtrip_of_canonical_value():
    value = {"b": [1, 2, b"\x00"], "a": "text", "aa": 1.5, "n": -3}
    data = codec.encode(value)
    assert codec.decode(data, max_size=100) == value


def test_map_keys_are_sorted_in_encoding():
    assert codec.encode({"b": 1, "a": 2}) == bytes.fromhex("a2616102616201")


@pytest.mark.parametrize(
    "data",
    [
        bytes.fromhex("a2616201616102"),  # keys out of order
        bytes.fromhex("1817"),  # 23 encoded with a one-byte argument
        bytes.fromhex("9f0102ff"),  # indefinite-length array
        bytes.fromhex("fb3ff8000000000000"),  # 1.5 as float64 where float16 suffices
        bytes.fromhex("a2616101616102"),  # duplicate key
    ],
)
def test_non_canonical_encodings_are_rejected(data):
    with pytest.raises(NonCanonicalError):
        codec.decode(data, max_size=100)


def test_oversize_is_rejected_before_parsing():
    with pytest.raises(OversizeError):
        codec.decode(codec.encode(b"x" * 100), max_size=50)


@pytest.mark.parametrize("data", [b"", bytes.fromhex("a1"), bytes.fromhex("5f"), b"\xff\xff"])
def test_truncated_or_garbage_is_a_decode_error(data):
    with pytest.raises(DecodeError):
        codec.decode(data, max_size=100)


def test_tags_are_refused():
    with pytest.raises(DecodeError, match="tag"):
        codec.decode(cbor2.dumps(cbor2.CBORTag(1, 0)), max_size=100)


def test_deep_nesting_is_refused():
    value = []
    for _ in range(20):
        value = [value]
    with pytest.raises(DecodeError, match="nesting"):
        codec.decode(codec.encode(value), max_size=1000)


def test_non_bytes_input_is_a_decode_error():
    with pytest.raises(DecodeError):
        codec.decode("text", max_size=100)  # type: ignore[arg-type]
