"""Suite ``codec``: canonical CBOR, valid and invalid encodings.

Case: ``{"description", "max_size", "encoded"}`` plus either ``"value"`` (typed JSON: decoding
gives it and encoding it gives ``encoded``) or ``"error"`` (the reason code decoding fails with).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from open1b.protocol import ProtocolError, decode, encode

from .common import hx, typed, unhex, untyped

NAME = "codec"
MAX = 1024

VALID = {
    "uint-0": (0, "smallest unsigned integer, in the initial byte"),
    "uint-23": (23, "largest integer in the initial byte"),
    "uint-24": (24, "smallest integer with a one-byte argument"),
    "uint-65536": (65536, "a four-byte argument"),
    "uint-max": (2**64 - 1, "largest unsigned integer"),
    "nint-1": (-1, "negative integer -1"),
    "nint-min": (-(2**64), "most negative integer"),
    "float-half": (1.5, "a float exact in binary16 is encoded in binary16"),
    "float-single": (100000.0, "exact in binary32 but not binary16"),
    "float-double": (0.1, "needs binary64"),
    "float-neg-zero": (-0.0, "negative zero keeps its sign"),
    "float-subnormal-half": (5.960464477539063e-08, "the smallest binary16 subnormal"),
    "float-nan": (float("nan"), "NaN is binary16 0x7e00 (schemas refuse NaN; the codec does not)"),
    "bytes-empty": (b"", "empty byte string"),
    "bytes-32": (bytes(range(32)), "a 32-byte string, as hashes and keys are"),
    "text-utf8": ("zürich ✓", "text is UTF-8; lengths count bytes"),
    "bools-null": ([False, True, None], "the three allowed simple values"),
    "nested-8": ([[[[[[[[0]]]]]]]], "a scalar inside 8 arrays, the deepest allowed"),
    "nested-8-empty": ([[[[[[[[]]]]]]]], "8 nested arrays, the innermost empty: no array lies inside 8 others"),
    "nested-8-maps": ({"a": {"a": {"a": {"a": {"a": {"a": {"a": {"a": 0}}}}}}}}, "a scalar inside 8 maps"),
    "map-key-order": ({"b": 1, "aa": 2, "a": 3, "ab": 4}, "keys sort shorter first, then bytewise"),
    "map-message-like": ({"kind": "claim", "v": 1, "step": 7, "run": bytes(32)}, "a message-shaped map"),
}

INVALID = {
    "unsorted-keys": ("a2616201616102", "non_canonical", "map keys out of order"),
    "duplicate-key": ("a2616101616102", "non_canonical", "the same key twice"),
    "overlong-uint": ("1817", "non_canonical", "23 with a one-byte argument"),
    "overlong-length": ("7800", "non_canonical", "empty text with a one-byte length"),
    "wide-float": ("fb3ff8000000000000", "non_canonical", "1.5 as binary64 where binary16 suffices"),
    "wide-float-single": ("fa3fc00000", "non_canonical", "1.5 as binary32"),
    "indefinite-array": ("9f0102ff", "non_canonical", "indefinite-length array"),
    "indefinite-bytes": ("5f4101ff", "non_canonical", "indefinite-length byte string"),
    "tag-datetime": ("c11a6553f100", "malformed", "tag 1 (epoch time)"),
    "tag-bignum": ("c249010000000000000000", "malformed", "tag 2 (bignum 2^64)"),
    "tag-self-describe": ("d9d9f700", "malformed", "tag 55799 (self-described CBOR)"),
    "simple-undefined": ("f7", "malformed", "undefined"),
    "simple-other": ("f0", "malformed", "simple value 16"),
    "reserved-info": ("1c", "malformed", "additional information 28 is reserved"),
    "truncated-map": ("a1", "malformed", "a map missing its entry"),
    "truncated-bytes": ("4301", "malformed", "a byte string shorter than its length"),
    "empty-input": ("", "malformed", "no data item at all"),
    "trailing-bytes": ("0000", "malformed", "two data items"),
    "bad-utf8": ("62c328", "malformed", "text that is not UTF-8"),
    "too-deep": ("818181818181818180", "malformed", "9 nested arrays: the innermost (empty) lies inside 8 others"),
    "too-deep-scalar": ("81818181818181818100", "malformed", "a scalar inside 9 arrays"),
    "too-deep-maps": ("a16161" * 8 + "a0", "malformed", "9 nested maps"),
    "length-first-keys": ("a262616101616202", "non_canonical", "key \"aa\" before the shorter \"b\""),
    "key-uint": ("a10000", "malformed", "a map key that is an integer: keys are text"),
    "key-bytes": ("a1410000", "malformed", "a map key that is a byte string"),
    "key-array": ("a1800000", "malformed", "a map key that is an array"),
    "indefinite-then-tag": ("9f01c1ff", "non_canonical", "the first defective head decides: indefinite before the tag"),
    "indefinite-truncated": ("9f01", "non_canonical", "an indefinite array that is also truncated"),
    "tag-then-indefinite": ("c19f", "malformed", "the first defective head decides: the tag before the indefinite"),
    "indefinite-tag-head": ("df", "non_canonical", "additional information 31 is non_canonical in every major type"),
    "lone-break": ("ff", "non_canonical", "a break byte (additional information 31) outside any item"),
    "indefinite-key": ("a15f4161ff00", "non_canonical", "an indefinite byte string as a map key: rule 1 (an indefinite "
                       "length) decides before rule 4 (a key that is not text)"),
    "indefinite-array-key": ("a19fff00", "non_canonical", "an indefinite array as a map key: rule 1 before rule 4"),
    "nested-8-then-indefinite": ("8181818181818181" + "9fff", "non_canonical", "an indefinite array inside 8 "
                                 "arrays: rule 1 decides before rule 8 (too deep)"),
    "false-two-bytes": ("f814", "malformed", "false spelled as simple value 20 in a one-byte argument (additional "
                        "information 24): rule 6 refuses the head, it is not a non-canonical false"),
    "indefinite-after-bad-utf8": ("8262c3289fff", "non_canonical", "heads are scanned before any text is checked"),
    "bytes-after-then-indefinite": ("009fff", "malformed", "one data item, then bytes: the item ends before them"),
    "nan-payload": ("f97e01", "non_canonical", "a NaN other than 0xf97e00"),
    "nan-single": ("fa7fc00000", "non_canonical", "NaN as binary32"),
}


def cases() -> dict[str, dict]:
    out = {}
    for name, (value, description) in VALID.items():
        out[name] = {"description": description, "max_size": MAX, "value": typed(value), "encoded": hx(encode(value))}
    for name, (data, error, description) in INVALID.items():
        out[name] = {"description": description, "max_size": MAX, "encoded": "0x" + data, "error": error}
    big = encode(bytes(40))
    out["oversize"] = {"description": "longer than max_size: refused before parsing", "max_size": len(big) - 1,
                       "encoded": hx(big), "error": "oversize"}
    out["oversize-garbage"] = {"description": "size is checked before anything is parsed", "max_size": 1,
                               "encoded": "0xffc1", "error": "oversize"}
    out["at-max-size"] = {"description": "exactly max_size bytes is allowed", "max_size": len(big),
                          "value": typed(bytes(40)), "encoded": hx(big)}
    return out


def check(case: dict, root: Path) -> None:
    data = unhex(case["encoded"])
    if "error" in case:
        with pytest.raises(ProtocolError) as info:
            decode(data, max_size=case["max_size"])
        assert info.value.code == case["error"], info.value
        return
    value = untyped(case["value"])
    assert encode(value) == data
    assert typed(decode(data, max_size=case["max_size"])) == case["value"]
