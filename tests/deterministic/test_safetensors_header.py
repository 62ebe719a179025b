"""The one bounded safetensors header parser (deterministic/safetensors_header.py), which the
replay, the spot checks and a node's fetch of a peer's checkpoint all use."""

import json
import struct

import pytest

from open1b.deterministic.safetensors_header import HeaderError, header_length, parse

LIMIT = 1 << 20


def file_header(entries: dict) -> tuple[bytes, int]:
    text = json.dumps(entries).encode()
    data = sum(e["data_offsets"][1] - e["data_offsets"][0] for k, e in entries.items() if k != "__metadata__")
    return struct.pack("<Q", len(text)) + text, 8 + len(text) + data


GOOD = {"__metadata__": {"k": "v"}, "b": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "a": {"dtype": "I32", "shape": [1, 3], "data_offsets": [8, 20]}}


def test_a_well_formed_header_gives_each_tensors_absolute_range():
    header, size = file_header(GOOD)
    entries, metadata = parse(header, size, LIMIT)
    assert metadata == {"k": "v"}
    assert [(e.name, e.dtype, e.shape, e.offset, e.nbytes) for e in entries] == [
        ("b", "float32", (2,), len(header), 8), ("a", "int32", (1, 3), len(header) + 8, 12)]


def test_the_length_is_bounded_before_the_header_is_read():
    with pytest.raises(HeaderError, match="a header of 1099511627776 bytes"):
        header_length(struct.pack("<Q", 1 << 40), LIMIT)
    with pytest.raises(HeaderError, match="8-byte"):
        header_length(b"\x01\x00", LIMIT)


@pytest.mark.parametrize("edit, said", [
    (lambda e: e["a"].update(data_offsets=[12, 24]), "gap or an overlap"),
    (lambda e: e["a"].update(data_offsets=[4, 16]), "gap or an overlap"),
    (lambda e: e["a"].update(dtype="F64"), "malformed"),
    (lambda e: e["a"].update(shape=[2, 3]), "data_offsets"),
    (lambda e: e["a"].update(shape=[-1, 3]), "malformed"),
    (lambda e: e.update({"__metadata__": {"k": 1}}), "metadata"),
    (lambda e: [e.pop("a"), e.pop("b")], "no tensor"),
], ids=["gap", "overlap", "dtype", "shape-bytes", "negative", "metadata", "empty"])
def test_a_malformed_header_is_refused(edit, said):
    entries = json.loads(json.dumps(GOOD))
    edit(entries)
    header, size = file_header(entries)
    with pytest.raises(HeaderError, match=said):
        parse(header, size, LIMIT)


def test_the_tensors_must_end_at_the_files_end():
    header, size = file_header(GOOD)
    with pytest.raises(HeaderError, match="a file of"):
        parse(header, size + 1, LIMIT)
    with pytest.raises(HeaderError, match="not JSON"):
        parse(struct.pack("<Q", 4) + b"{{{{", 12, LIMIT)
