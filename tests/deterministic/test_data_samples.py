"""Samples (docs/run-format.md §4): cutting, digests, the Merkle commitment and its proofs, and the
samples file — round trip, and refusal of every malformed, oversized, truncated or foreign file.

Digests and roots are checked against independent re-statements of the spec's rules written
here with hashlib alone, not against values the code under test produced.
"""

import hashlib
import struct

import numpy as np
import pytest

from open1b.deterministic.errors import RunFormatError, SamplesFormatError, SamplesMismatchError
from open1b.deterministic.samples import (
    HEADER_SIZE, Dataset, cut_samples, decode_samples, encode_samples, read_samples, verify_sample, write_samples,
)  # fmt: skip
from open1b.protocol import Open1bError


def b2(*parts: bytes) -> bytes:
    return hashlib.blake2b(b"".join(parts), digest_size=32).digest()


def mth(leaves: list[bytes]) -> bytes:
    """RFC 6962 §2.1 Merkle tree hash, recursive form, with B2 (the spec's statement)."""
    if len(leaves) == 1:
        return b2(b"\x00", leaves[0])
    k = 1 << ((len(leaves) - 1).bit_length() - 1)
    return b2(b"\x01", mth(leaves[:k]), mth(leaves[k:]))


def spec_digest(row_bytes: bytes, width: int = 1) -> bytes:
    return b2(b"open1b/sample/v1\x00", bytes([width]), row_bytes)


TEXT = "Samples are fixed rows of the token stream; every byte here is a token. " * 3
TOKENS = np.frombuffer(TEXT.encode(), np.uint8)


@pytest.fixture
def dataset() -> Dataset:
    return Dataset.from_samples(cut_samples(TOKENS, 9), 256)


def test_cut_is_stride_len_minus_one_and_drops_the_tail():
    L = 9
    samples = cut_samples(TOKENS, L)
    n = (len(TOKENS) - 1) // (L - 1)
    assert samples.shape == (n, L)
    for i in range(n):
        assert samples[i].tobytes() == TOKENS[i * (L - 1) : i * (L - 1) + L].tobytes()
    # Every adjacent (input, target) pair of the covered stream occurs in exactly one sample.
    assert samples[:-1, -1].tolist() == samples[1:, 0].tolist()
    with pytest.raises(ValueError):
        cut_samples(TOKENS[:5], L)


def test_digests_and_root_follow_the_spec(dataset):
    rows = [dataset.samples[i].tobytes() for i in range(dataset.n)]
    assert list(dataset.digests) == [spec_digest(r) for r in rows]
    assert dataset.root == mth(list(dataset.digests))
    assert dataset.sample_len == 9 and dataset.n == (len(TOKENS) - 1) // 8
    assert not dataset.samples.flags.writeable


def test_wide_tokens_use_u16le_and_say_so_in_the_digest():
    ds = Dataset.from_samples(np.array([[0, 300, 65535], [1, 2, 3]]), 65536)
    assert ds.samples.dtype == np.dtype("<u2")
    assert ds.digests[0] == spec_digest(struct.pack("<3H", 0, 300, 65535), width=2)


def test_every_proof_verifies_and_any_tamper_fails(dataset):
    n = dataset.n
    for i in range(n):
        proof = dataset.proof(i)
        row = dataset.samples[i]
        assert verify_sample(row, i, n, proof, dataset.root)
        bad = row.copy()
        bad[i % len(bad)] ^= 1
        assert not verify_sample(bad, i, n, proof, dataset.root)  # a flipped token bit
        assert not verify_sample(row, (i + 1) % n, n, proof, dataset.root)  # another index
        # (The tree size is not bound by the root alone — an RFC 6962 path of a left leaf also
        # fits larger trees — which is why the signed manifest carries N beside samples_root.)
        for p in range(len(proof)):  # a flipped bit in any proof entry
            forged = [bytes(x) for x in proof]
            forged[p] = bytes([forged[p][0] ^ 0x80]) + forged[p][1:]
            assert not verify_sample(row, i, n, forged, dataset.root)
        assert not verify_sample(row, i, n, proof[:-1], dataset.root)
    root = bytearray(dataset.root)
    root[31] ^= 1
    assert not verify_sample(dataset.samples[0], 0, n, dataset.proof(0), bytes(root))


def _read(path, ds, **kw):
    args = dict(expected_root=ds.root, expected_count=ds.n, expected_sample_len=ds.sample_len, vocab_size=256)
    return read_samples(path, **{**args, **kw})


def test_file_round_trip_and_layout(tmp_path, dataset):
    path = tmp_path / "samples.bin"
    address = write_samples(path, dataset)
    data = path.read_bytes()
    assert address == b2(data)
    header = b"OPEN1BSM" + struct.pack("<HBBIIQI", 1, 1, 0, 256, 9, dataset.n, 0)
    assert len(header) == HEADER_SIZE == 32 and data[:32] == header
    assert data[32:] == dataset.samples.tobytes() and len(data) == 32 + dataset.n * 9
    back = _read(path, dataset, expected_digest=address, expected_size=len(data))
    assert back.root == dataset.root and back.samples.tobytes() == dataset.samples.tobytes()
    assert back.digests == dataset.digests


def _header(**kw) -> bytes:
    f = dict(magic=b"OPEN1BSM", version=1, width=1, r8=0, vocab=256, L=9, n=2, r32=0) | kw
    return struct.pack("<8sHBBIIQI", *(f[k] for k in ("magic", "version", "width", "r8", "vocab", "L", "n", "r32")))


@pytest.mark.parametrize("data, message", [
    (b"", "shorter than"),
    (b"OPEN1BSM" + bytes(10), "shorter than"),
    (_header(magic=b"OPEN1BSX") + bytes(18), "magic"),
    (_header(version=2) + bytes(18), "version 2 is not supported; this node reads 1"),
    (_header(width=3) + bytes(18), "width"),
    (_header(width=2) + bytes(36), "width 2"),
    (_header(r8=1) + bytes(18), "reserved"),
    (_header(r32=1) + bytes(18), "reserved"),
    (_header(vocab=0) + bytes(18), "vocab 0"),
    (_header(vocab=257) + bytes(18), "vocab 257"),
    (_header(L=1, n=2) + bytes(2), "sample_len 1"),
    (_header() + bytes(17), "is 49 bytes; its header says 50"),  # truncated by one byte
    (_header() + bytes(19), "is 51 bytes; its header says 50"),  # one trailing byte
    (_header(vocab=8) + bytes(17) + b"\x08", "token 8 >= vocab 8"),
])  # fmt: skip
def test_malformed_files_are_refused(data, message):
    with pytest.raises(SamplesFormatError, match=message) as info:
        decode_samples(data, expected_root=bytes(32), expected_count=2)
    assert isinstance(info.value, RunFormatError) and isinstance(info.value, Open1bError)


def test_a_file_of_another_run_is_refused(tmp_path, dataset):
    path = tmp_path / "samples.bin"
    address = write_samples(path, dataset)
    size = path.stat().st_size
    with pytest.raises(SamplesMismatchError, match="commits to"):
        _read(path, dataset, expected_count=dataset.n + 1)
    with pytest.raises(SamplesMismatchError, match="model needs"):
        _read(path, dataset, expected_sample_len=17)
    with pytest.raises(SamplesMismatchError, match="tokenizer"):
        _read(path, dataset, vocab_size=300)
    with pytest.raises(SamplesMismatchError, match="blob"):
        _read(path, dataset, expected_digest=bytes(32))
    with pytest.raises(SamplesMismatchError, match="names a file of"):
        _read(path, dataset, expected_size=size - 1)
    with pytest.raises(SamplesMismatchError, match="samples_root"):
        _read(path, dataset, expected_root=bytes(32))
    # One token changed in place, same size and header: only the root (or the address) catches it.
    data = bytearray(path.read_bytes())
    data[HEADER_SIZE + 5] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(SamplesMismatchError, match="samples_root"):
        _read(path, dataset)
    with pytest.raises(SamplesMismatchError, match="blob"):
        _read(path, dataset, expected_digest=address)


def test_size_is_bounded_before_reading(tmp_path, dataset):
    path = tmp_path / "samples.bin"
    write_samples(path, dataset)
    with pytest.raises(SamplesFormatError, match=r"more than the \d+ allowed"):
        _read(path, dataset, max_bytes=path.stat().st_size - 1)
    with pytest.raises(SamplesFormatError, match="cannot read"):
        _read(tmp_path / "absent.bin", dataset)
    # A header claiming a huge N is refused on the count and the size, before any token is touched.
    huge = _header(n=1 << 60) + bytes(64)
    with pytest.raises(SamplesMismatchError):
        decode_samples(huge, expected_root=bytes(32), expected_count=2)
    with pytest.raises(SamplesFormatError, match="header says"):
        decode_samples(huge, expected_root=bytes(32), expected_count=1 << 60)


def test_encode_is_the_file(dataset, tmp_path):
    assert write_samples(tmp_path / "s.bin", dataset) == b2(encode_samples(dataset))
