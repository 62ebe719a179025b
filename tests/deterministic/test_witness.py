"""The replay witness (docs/run-format.md §5.1): rule v2 (the chunk tree) equals the spec written
out with hashlib alone, whatever the number of threads; rule v1 keeps the bits engine 0.4.0 gave."""

import hashlib
import struct
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from open1b.deterministic.witness import replay_witness, witness_async
from open1b.protocol import TensorBytes
from open1b.protocol.witness import WITNESS_SEQUENTIAL, WITNESS_TREE, tree_witness

F = np.float32


def _b2(*parts: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=32)
    for p in parts:
        h.update(p)
    return h.digest()


def _mth(values: list[bytes]) -> bytes:
    """RFC 6962's recursive definition (docs/protocol.md §6.2), leaf(x) = B2(0x00 ‖ x)."""
    if len(values) == 1:
        return _b2(b"\x00", values[0])
    k = 1 << ((len(values) - 1).bit_length() - 1)  # the largest power of two below len(values)
    return _b2(b"\x01", _mth(values[:k]), _mth(values[k:]))


def spec_tree_witness(loss: np.float32, grads: dict[str, np.ndarray]) -> bytes:
    """W_k by rule v2, from run-format §3.2, §3.3 and §5.1 alone."""
    digests = []
    for name in sorted(grads, key=str.encode):
        g, size = grads[name], 1 << 20
        raw = g.astype("<f4").tobytes()
        chunks = [raw[i:i + size] for i in range(0, max(len(raw), 1), size)]
        root = _mth([_b2(b"open1b/chunk/v2\x00", struct.pack("<Q", i), c) for i, c in enumerate(chunks)])
        encoded = name.encode()
        digests.append(_b2(b"open1b/tensor/v2\x00", struct.pack("<H", len(encoded)), encoded, b"\x07float32",
                           struct.pack(f"<B{g.ndim}Q", g.ndim, *g.shape), struct.pack("<Q", len(raw)), root))
    return _b2(b"open1b/witness/v2\x00", F(loss).astype("<f4").tobytes(), struct.pack("<I", len(digests)), _mth(digests))


@pytest.fixture(scope="module")
def grads():
    """Gradients in canonical order whose names sort otherwise, one of 2.5 MiB (three chunks)."""
    rng = np.random.default_rng(3)
    return {"wte": rng.standard_normal((640, 1024)).astype(F), "h0.w": rng.standard_normal((5, 7)).astype(F),
            "b": np.array([-0.0, 1e-40, np.inf], F)}  # fmt: skip


def test_tree_witness_is_the_spec_on_any_number_of_threads(grads):
    order = list(grads)
    want = spec_tree_witness(F(2.5), grads)
    assert replay_witness(F(2.5), grads, order) == want  # the engine's default: every core
    assert witness_async(F(2.5), grads, order, F(1), F(1)).witness.result(timeout=60) == want
    tensors = {n: TensorBytes("float32", g.shape, g.tobytes()) for n, g in grads.items()}
    bits = int(F(2.5).view(np.uint32))
    with ThreadPoolExecutor(5) as pool:
        assert {tree_witness(bits, tensors, workers=w) for w in (1, 3, pool)} == {want}
    # Any changed bit of the loss or of one chunk, or a renamed gradient, is another witness.
    flipped = {**grads, "wte": grads["wte"].copy()}
    flipped["wte"].view(np.uint32)[639, 1023] ^= 1
    assert len({want, spec_tree_witness(F(2.5), flipped), spec_tree_witness(np.nextafter(F(2.5), F(3)), grads),
                replay_witness(F(2.5), {"wtf": grads["wte"], **grads}, ["wtf", "h0.w", "b"])}) == 4


def test_sequential_witness_keeps_engine_0_4_bits():
    # Computed by engine 0.4.0's replay_witness, the only rule it had, on these inputs.
    g = {"a": np.arange(6, dtype=F).reshape(2, 3) * F(0.5), "b": np.array([-1.0], F)}
    pinned = "907626186948c72382fe29558d03319c9f6828348d18494278af6ef5089627d1"
    assert replay_witness(F(2.25), g, ["a", "b"], WITNESS_SEQUENTIAL).hex() == pinned
    assert witness_async(F(2.25), g, ["a", "b"], F(1), F(1), WITNESS_SEQUENTIAL).witness.result(timeout=60).hex() == pinned
    assert replay_witness(F(2.25), g, ["a", "b"], WITNESS_TREE) == spec_tree_witness(F(2.25), g)


def test_an_unknown_rule_is_refused_before_anything_is_hashed(grads):
    with pytest.raises(ValueError, match="unknown witness rule"):
        witness_async(F(1), grads, list(grads), F(1), F(1), "open1b/witness/v3")
