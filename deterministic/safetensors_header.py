"""The header of a safetensors file, ``u64le(n) ‖ JSON header of n bytes ‖ data``, parsed once,
with bounds, for everything that reads a checkpoint it did not write: the replay and the spot
checks (:mod:`.checkpoint_stream`, :mod:`.spot_state`) and a node's fetch of a peer's file
(``node/chunk_table.py``).

:func:`header_length` refuses n outside ``[2, limit]`` before a byte of the header is read;
:func:`parse` then requires a JSON object of tensor entries (and optional text metadata), each
with a known dtype, a shape of at most 255 dimensions under 2^40, and a data range of exactly its
bytes, and the ranges to tile the data section with no gap or overlap, to the file's last byte:
every data byte belongs to exactly one tensor. What the tensors must be (a run model's names,
float32, shapes, step) is each caller's check.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

from open1b.protocol.commitments import ITEMSIZE

from .errors import RunFormatError

PREFIX = 8  # u64le n
DTYPES = {"F32": "float32", "I32": "int32", "I64": "int64", "U8": "uint8"}  # safetensors' name -> the protocol's


class HeaderError(RunFormatError):
    """Bytes that are not a well-formed safetensors header of a file of the given size."""


@dataclass(frozen=True)
class Entry:
    """One tensor of the header: its byte range as absolute offsets in the file."""

    name: str
    dtype: str  # the protocol's name: "float32", …
    shape: tuple[int, ...]
    offset: int
    nbytes: int


def header_length(prefix: bytes, limit: int) -> int:
    """``n`` from a file's first 8 bytes, refused unless 2 ≤ n ≤ ``limit``."""
    if len(prefix) < PREFIX:
        raise HeaderError("a safetensors file starts with an 8-byte header length")
    (n,) = struct.unpack_from("<Q", prefix)
    if not 2 <= n <= limit:
        raise HeaderError(f"a header of {n} bytes (at most {limit})")
    return n


def parse(header: bytes, size: int, limit: int) -> tuple[list[Entry], dict[str, str]]:
    """The tensors (in the header's order) and metadata of a ``size``-byte file whose first bytes
    are ``header``: the 8-byte length and the JSON header, exactly."""
    n = header_length(header, limit)
    if len(header) != PREFIX + n:
        raise HeaderError(f"{len(header)} header bytes for a header of {n}")
    try:
        entries = json.loads(bytes(header[PREFIX:]))
    except (UnicodeDecodeError, ValueError) as exc:
        raise HeaderError(f"the header is not JSON: {exc}") from None
    if type(entries) is not dict:
        raise HeaderError("the header is not a JSON object")
    metadata = entries.pop("__metadata__", {})
    if type(metadata) is not dict or not all(type(k) is str and type(v) is str for k, v in metadata.items()):
        raise HeaderError("the header's metadata is not a map of texts")
    data_start, out, ranges = PREFIX + n, [], []
    for name, entry in entries.items():
        if (type(entry) is not dict or set(entry) != {"dtype", "shape", "data_offsets"}
                or entry["dtype"] not in DTYPES or type(entry["shape"]) is not list
                or not all(type(d) is int and 0 <= d < 1 << 40 for d in entry["shape"]) or len(entry["shape"]) > 255
                or type(entry["data_offsets"]) is not list or len(entry["data_offsets"]) != 2
                or not all(type(o) is int for o in entry["data_offsets"])):
            raise HeaderError(f"tensor {name!r}: malformed header entry")
        dtype, shape = DTYPES[entry["dtype"]], tuple(entry["shape"])
        begin, end = entry["data_offsets"]
        nbytes = ITEMSIZE[dtype]
        for d in shape:
            nbytes *= d
        if not 0 <= begin <= end or end - begin != nbytes:
            raise HeaderError(f"tensor {name!r}: data_offsets {begin, end} for {nbytes} bytes")
        out.append(Entry(name, dtype, shape, data_start + begin, nbytes))
        ranges.append((begin, end))
    if not out:
        raise HeaderError("the header names no tensor")
    at = 0
    for begin, end in sorted(ranges):  # the tensors tile the data section: no byte is outside every tensor
        if begin != at:
            raise HeaderError(f"the data section has a gap or an overlap at byte {at}")
        at = end
    if data_start + at != size:
        raise HeaderError(f"a file of {size} bytes for a header and {at} bytes of tensors")
    return out, metadata
