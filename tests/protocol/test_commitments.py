"""The v2 state hash (docs/run-format.md §3): the threaded tree hash against a slow transcription of
the spec, independence from the number of workers, what h binds, and tensor and chunk proofs."""

import hashlib
import struct
from dataclasses import replace

import pytest

from open1b.protocol import (
    CHUNK_SIZE, TensorBytes, TensorProof, batch_digest, state_hash, tensor_digest, tensor_proof, verify_tensor_proof,
)
from open1b.protocol.commitments import chunk_proof, verify_chunk_proof


# --- the spec, transcribed as plainly as possible (serial, recursive, hashlib only) -------------

def b2(*parts: bytes) -> bytes:
    return hashlib.blake2b(b"".join(parts), digest_size=32).digest()


def mth(xs: list[bytes]) -> bytes:
    if len(xs) == 1:
        return b2(b"\x00", xs[0])
    k = 1
    while k * 2 < len(xs):
        k *= 2
    return b2(b"\x01", mth(xs[:k]), mth(xs[k:]))


def ref_tensor_digest(name: str, t: TensorBytes) -> bytes:
    raw = bytes(t.data)
    chunks = [raw[i:i + CHUNK_SIZE] for i in range(0, len(raw), CHUNK_SIZE)] or [b""]
    root = mth([b2(b"open1b/chunk/v2\x00", struct.pack("<Q", i), c) for i, c in enumerate(chunks)])
    n = name.encode()
    return b2(b"open1b/tensor/v2\x00", struct.pack("<H", len(n)), n, bytes([len(t.dtype)]), t.dtype.encode(),
              bytes([len(t.shape)]), *(struct.pack("<Q", d) for d in t.shape), struct.pack("<Q", len(raw)), root)


def ref_state_hash(prev, step, tensors, bd, lr_bits) -> bytes:
    names = sorted(tensors, key=str.encode)
    root = mth([ref_tensor_digest(n, tensors[n]) for n in names])
    return b2(b"open1b/state/v2\x00", prev, struct.pack("<Q", step), struct.pack("<I", lr_bits), bd,
              struct.pack("<I", len(tensors)), root)


# --- fixtures ----------------------------------------------------------------------------------

def pattern(n: int, salt: int = 0) -> bytes:
    block = bytes((i * 7 + salt) % 251 for i in range(256))
    return block * (n // 256) + block[:n % 256]


def u8(n: int, salt: int = 0) -> TensorBytes:
    return TensorBytes("uint8", (n,), pattern(n, salt))


PREV, BD, LR = b2(b"prev"), b2(b"batch digest"), 0x3A83126F  # LR: float32 bits of 0.001
STATE = {
    "param/w": TensorBytes("float32", (3, 2), pattern(24, 1)),
    "param/big": u8(3 * CHUNK_SIZE + 17, 2),            # four chunks, the last of 17 bytes
    "param/exact": u8(CHUNK_SIZE, 3),                   # exactly one full chunk, no empty second one
    "param/one-over": u8(CHUNK_SIZE + 1, 4),            # a full chunk and a 1-byte one
    "adam/beta1_pow": TensorBytes("float32", (), pattern(4, 5)),
    "empty": TensorBytes("int64", (2, 0), b""),         # one empty chunk
    "zürich": TensorBytes("int32", (1, 1, 2), pattern(8, 6)),
}
H = state_hash(PREV, 9, STATE, BD, lr_bits=LR)


def test_matches_the_spec_transcription():
    assert H == ref_state_hash(PREV, 9, STATE, BD, LR)
    for name, t in STATE.items():
        assert tensor_digest(name, t) == ref_tensor_digest(name, t)


@pytest.mark.parametrize("workers", [1, 2, 3, 8, 64])
def test_result_is_independent_of_workers(workers):
    assert state_hash(PREV, 9, STATE, BD, lr_bits=LR, workers=workers) == H
    big = STATE["param/big"]
    assert tensor_digest("param/big", big, workers=workers) == ref_tensor_digest("param/big", big)


def test_insertion_order_and_buffer_type_do_not_matter():
    assert state_hash(PREV, 9, dict(reversed(list(STATE.items()))), BD, lr_bits=LR) == H
    views = {n: replace(t, data=memoryview(bytes(t.data))) for n, t in STATE.items()}
    assert state_hash(PREV, 9, views, BD, lr_bits=LR) == H
    floats = memoryview(bytes(STATE["param/w"].data)).cast("f")  # as numpy hands it over: items, not bytes
    assert state_hash(PREV, 9, {**STATE, "param/w": replace(STATE["param/w"], data=floats)}, BD, lr_bits=LR) == H


def flip(data: bytes, i: int) -> bytes:
    return data[:i] + bytes([data[i] ^ 1]) + data[i + 1:]


def test_every_field_is_bound():
    others = [
        state_hash(bytes(32), 9, STATE, BD, lr_bits=LR),
        state_hash(PREV, 10, STATE, BD, lr_bits=LR),
        state_hash(PREV, 9, STATE, BD, lr_bits=LR + 1),
        state_hash(PREV, 9, STATE, bytes(32), lr_bits=LR),
        state_hash(PREV, 9, {("param/W" if n == "param/w" else n): t for n, t in STATE.items()}, BD, lr_bits=LR),
        state_hash(PREV, 9, {**STATE, "param/w": TensorBytes("int32", (3, 2), STATE["param/w"].data)}, BD, lr_bits=LR),
        state_hash(PREV, 9, {**STATE, "param/w": TensorBytes("float32", (2, 3), STATE["param/w"].data)}, BD,
                   lr_bits=LR),
        state_hash(PREV, 9, {**STATE, "empty": TensorBytes("int64", (0,), b"")}, BD, lr_bits=LR),
        state_hash(PREV, 9, {n: t for n, t in STATE.items() if n != "empty"}, BD, lr_bits=LR),
    ]
    big = STATE["param/big"].data
    for i in (0, CHUNK_SIZE - 1, CHUNK_SIZE, 2 * CHUNK_SIZE + 5, len(big) - 1):
        others.append(state_hash(PREV, 9, {**STATE, "param/big": TensorBytes("uint8", (len(big),), flip(big, i))},
                                 BD, lr_bits=LR))
    assert len({H, *others}) == len(others) + 1


@pytest.mark.parametrize("bad", [
    dict(prev=bytes(31)), dict(batch=bytes(33)), dict(step=-1), dict(step=1 << 64), dict(lr_bits=1 << 32),
    dict(lr_bits=-1), dict(lr_bits=1.0), dict(tensors={}), dict(workers=0),
    dict(tensors={"x": TensorBytes("float32", (3,), bytes(11))}),    # bytes do not match the shape
    dict(tensors={"x": TensorBytes("float16", (2,), bytes(4))}),     # unsupported dtype
    dict(tensors={"x": TensorBytes("uint8", (-1,), b"")}),
])
def test_invalid_inputs_are_refused(bad):
    args = dict(prev=PREV, step=1, tensors={"x": u8(3)}, batch=BD, lr_bits=0, workers=None) | bad
    with pytest.raises(ValueError):
        state_hash(args["prev"], args["step"], args["tensors"], args["batch"], lr_bits=args["lr_bits"],
                   workers=args["workers"])


def test_batch_digest_uses_v2_tensor_digests():
    batches = [TensorBytes("int32", (2, 3), pattern(24, r)) for r in range(2)]
    want = b2(b"open1b/batch/v2\x00", struct.pack("<I", 2),
              *(ref_tensor_digest(f"rank/{r}", b) for r, b in enumerate(batches)))
    assert batch_digest(batches) == want


# --- tensor proofs -----------------------------------------------------------------------------

PROOFS = {name: tensor_proof(PREV, 9, STATE, BD, name, lr_bits=LR, workers=2) for name in STATE}


@pytest.mark.parametrize("name", sorted(STATE))
def test_a_valid_proof_verifies(name):
    assert verify_tensor_proof(name, STATE[name], PROOFS[name], H)


def test_any_flipped_byte_fails():
    for name, t in STATE.items():
        data = bytes(t.data)
        positions = sorted({0, len(data) // 2, len(data) - 1, CHUNK_SIZE, 3 * CHUNK_SIZE} & set(range(len(data))))
        for i in positions:
            assert not verify_tensor_proof(name, replace(t, data=flip(data, i)), PROOFS[name], H), (name, i)


def test_wrong_name_dtype_shape_or_hash_fails():
    w, p = STATE["param/w"], PROOFS["param/w"]
    assert not verify_tensor_proof("param/W", w, p, H)
    assert not verify_tensor_proof("param/big", w, p, H)
    assert not verify_tensor_proof("param/w", TensorBytes("int32", w.shape, w.data), p, H)
    assert not verify_tensor_proof("param/w", TensorBytes("float32", (6,), w.data), p, H)
    assert not verify_tensor_proof("param/w", TensorBytes("float32", (3, 2), bytes(w.data)[:-1]), p, H)  # malformed
    assert not verify_tensor_proof("param/w", w, p, flip(H, 0))
    assert not verify_tensor_proof("param/w", w, PROOFS["param/big"], H)  # another tensor's proof


def test_tampered_proofs_fail():
    p = PROOFS["param/w"]
    assert len(p.path) >= 2 and p.count == len(STATE)
    tampered = [
        replace(p, index=p.index + 1), replace(p, index=p.index - 1), replace(p, index=-1),
        replace(p, count=p.count + 1), replace(p, count=p.count - 1),
        replace(p, path=p.path[:-1]), replace(p, path=p.path + (H,)),
        replace(p, path=(flip(p.path[0], 31),) + p.path[1:]), replace(p, path=tuple(reversed(p.path))),
        replace(p, step=p.step + 1), replace(p, lr_bits=p.lr_bits ^ 1), replace(p, prev=flip(p.prev, 3)),
        replace(p, batch_digest=flip(p.batch_digest, 3)), replace(p, state_root=flip(p.state_root, 0)),
        # malformed, not just wrong: still False, never an exception
        replace(p, index="0"), replace(p, step=9.0), replace(p, prev=b""), replace(p, path=(None,)),
        replace(p, count=0),
    ]
    for bad in tampered:
        assert not verify_tensor_proof("param/w", STATE["param/w"], bad, H), bad


def test_proof_of_an_unknown_tensor_is_refused():
    with pytest.raises(KeyError):
        tensor_proof(PREV, 9, STATE, BD, "nope", lr_bits=LR)


def test_proof_fields_are_the_preimage():
    p = PROOFS["empty"]
    assert isinstance(p, TensorProof) and (p.prev, p.step, p.lr_bits, p.batch_digest) == (PREV, 9, LR, BD)
    assert b2(b"open1b/state/v2\x00", p.prev, struct.pack("<QI", p.step, p.lr_bits), p.batch_digest,
              struct.pack("<I", p.count), p.state_root) == H


# --- chunk proofs ------------------------------------------------------------------------------

def test_chunk_proofs():
    data = bytes(STATE["param/big"].data)
    chunks = [data[i:i + CHUNK_SIZE] for i in range(0, len(data), CHUNK_SIZE)]
    assert [len(c) for c in chunks] == [CHUNK_SIZE] * 3 + [17]
    for i, c in enumerate(chunks):
        p = chunk_proof(PREV, 9, STATE, BD, "param/big", i, lr_bits=LR)
        assert verify_chunk_proof("param/big", i, c, p, H)
        assert not verify_chunk_proof("param/big", i, flip(c, len(c) - 1), p, H)
        assert not verify_chunk_proof("param/big", (i + 1) % 4, c, p, H)
        assert not verify_chunk_proof("param/w", i, c, p, H)
        assert not verify_chunk_proof("param/big", i, c + b"\x00", p, H)
        assert not verify_chunk_proof("param/big", i, c, replace(p, shape=(len(data) + 1,)), H)
        assert not verify_chunk_proof("param/big", i, c, replace(p, path=p.path[1:]), H)
        assert not verify_chunk_proof("param/big", i, c, replace(p, tensor=PROOFS["param/w"]), H)
    empty = chunk_proof(PREV, 9, STATE, BD, "empty", 0, lr_bits=LR)
    assert verify_chunk_proof("empty", 0, b"", empty, H) and not verify_chunk_proof("empty", 1, b"", empty, H)
