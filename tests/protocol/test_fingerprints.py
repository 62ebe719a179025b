"""The fingerprints file and its commitments (docs/run-format.md §10.1): what a reader accepts."""

import pytest

from open1b.protocol import encode
from open1b.protocol.errors import OversizeError, WrongTypeError
from open1b.protocol.fingerprints import (
    FingerprintsError, commitment, committed, data_fields, decode_fingerprints, fingerprints_root,
    max_fingerprints_size,
)  # fmt: skip
from open1b.protocol.hashing import blake2b256

SLOTS = 3


def entry(step: int, slots: int = SLOTS, big: bool = False) -> dict:
    """A fingerprint map; ``big``: every integer at its widest encoding."""
    top = (1 << 32) - 1 if big else step + 1
    return {"step": (1 << 63) + step if big else step, "losses": [top] * slots, "loss": top, "grad_norm": top, "clip_coef": top}


def file_of(entries: list[dict]) -> tuple[bytes, bytes]:
    return encode(entries), fingerprints_root([commitment(e) for e in entries])


def test_a_well_formed_file_decodes_and_its_data_keys_commit_to_it():
    entries = [entry(k) for k in range(4)]
    data, root = file_of(entries)
    assert decode_fingerprints(data, steps=4, slots=SLOTS, root=root) == entries
    keys = data_fields(data, [commitment(e) for e in entries])
    assert committed(keys) == (root, blake2b256(data))


def test_the_size_bound_holds_for_the_widest_encoding():
    for steps, slots in ((1, 1), (3, 32), (7, 240)):
        widest = encode([entry(k, slots, big=True) for k in range(steps)])
        assert len(widest) <= max_fingerprints_size(steps, slots)


@pytest.mark.parametrize("case", ["count", "step", "slots", "field", "root", "loss bits", "bool step", "r6 gradient roots",
                                  "r8-draft sum root"])
def test_a_file_that_is_not_the_committed_one_is_refused(case):
    entries = [entry(k) for k in range(3)]
    _, root = file_of(entries)
    bad = [dict(e) for e in entries]
    if case == "count":
        bad = bad[:2]
    elif case == "step":
        bad[1]["step"] = 2
    elif case == "slots":
        bad[0]["losses"] = bad[0]["losses"][:-1]
    elif case == "field":
        bad[0]["note"] = 1
    elif case == "root":
        bad[2]["loss"] += 1
    elif case == "loss bits":
        bad[0]["losses"] = [1 << 32] * SLOTS
    elif case == "bool step":
        bad[0]["step"] = False
    elif case == "r6 gradient roots":  # revision 6 committed a root per micro-batch: not this format
        bad[0]["grad_roots"] = [bytes(32)] * SLOTS
    elif case == "r8-draft sum root":  # a draft of revision 8 committed the summed gradient's root
        bad[0]["sum_root"] = bytes(32)
    with pytest.raises(FingerprintsError):
        decode_fingerprints(encode(bad), steps=3, slots=SLOTS, root=root)


def test_an_oversized_file_is_refused_before_decoding():
    with pytest.raises(OversizeError):
        decode_fingerprints(bytes(max_fingerprints_size(2, SLOTS) + 1), steps=2, slots=SLOTS, root=bytes(32))


@pytest.mark.parametrize("data", [{"fingerprints_root": "ab" * 32}, {"fingerprints_blob": "ab" * 32},
                                  {"fingerprints_root": "AB" * 32, "fingerprints_blob": "ab" * 32},
                                  {"fingerprints_root": "ab" * 31, "fingerprints_blob": "ab" * 32},
                                  {"fingerprints_root": 5, "fingerprints_blob": "ab" * 32}])
def test_malformed_data_keys_are_the_manifest_rule_fingerprints(data):
    with pytest.raises(WrongTypeError) as caught:
        committed(data)
    assert caught.value.code == "fingerprints"


def test_a_run_without_the_keys_commits_to_nothing():
    assert committed({"corpus": "x"}) is None
