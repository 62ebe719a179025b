"""Open-1B's v3 state hash: the hashlib-only verifier against a second implementation written
with torch from the same description (torch's own dtype names, shape tuples, ``torch.chunk``
shards, a real AdamW step and its param groups), over hand-offs written by the safetensors
library itself."""

import hashlib
import json
import struct

import pytest

from open1b.protocol import DecodeError
from open1b.protocol.gensyn_handoff import (
    HandoffMeta, handoff_params, handoff_state_hash, param_groups_json, read_safetensors,
)

from ..vectors.suite_gensyn_handoff import write_safetensors


def b2(*parts: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=32)
    for p in parts:
        h.update(p)
    return h.digest()


def torch_reference(params, optimizer, world, shards, prev, micro_batches):
    """H_k straight from the description, with torch doing the tensor work."""
    import torch

    def raw(t):
        return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()

    def record(tag, t):
        return tag + str(t.dtype).encode() + b"\0" + str(tuple(t.shape)).encode() + b"\0" + raw(t)

    def shard(t, i):
        if t.dim() == 0:
            return t
        chunks = torch.chunk(t, shards, dim=0)
        return chunks[i] if i < len(chunks) else t[t.shape[0]:]

    leaves = []
    for i in range(shards):
        stream = b""
        for name in sorted(params):
            p = params[name].detach()
            stream += name.encode() + b"\0" + record(b"weight\0", shard(p, i))
            state = optimizer.state.get(params[name])
            if state:
                stream += b"optim_step\0" + struct.pack("<q", int(state["step"].item()))
                stream += record(b"optim_exp_avg\0", shard(state["exp_avg"], i))
                stream += record(b"optim_exp_avg_sq\0", shard(state["exp_avg_sq"], i))
            g = params[name].grad
            stream += b"grad_none\0" if g is None else record(b"grad\0", shard(g, i))
        leaves.append(b2(stream))
    ss = b2(*(leaves[r % shards] for r in range(world)))
    groups = json.dumps([{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups], sort_keys=True)
    chains = []
    for rank in micro_batches:
        c = bytes(32)
        for batch in rank:
            c = b2(c, *(key.encode() + b"\0" + str(t.dtype).encode() + b"\0" + str(tuple(t.shape)).encode() + b"\0" + raw(t)
                        for key, t in sorted(batch.items())))
        chains.append(c)
    bd = chains[0] if world == 1 else b2(*chains)
    h = b2(b"pretrain.state_hash.v3\n", b"prev\0", prev, b"shard_state\0", ss, b"param_groups\0", groups.encode(),
           b"batch_digest\0", bd)
    return h, chains, groups


@pytest.mark.parametrize("world,shards", [(1, 1), (2, 1), (4, 2), (3, 3), (8, 4)])
def test_verifier_matches_a_torch_implementation(tmp_path, world, shards):
    import torch
    from safetensors.torch import save_file

    from open1b.node.verify_handoff import verify_handoff

    g = torch.Generator().manual_seed(world * 10 + shards)
    params = {
        "embed.weight": torch.randn(7, 3, generator=g), "blocks.0.ln.bias": torch.randn(1, 3, generator=g),
        "blocks.0.gain": torch.randn((), generator=g), "lm_head.weight": torch.randn(5, 3, generator=g).to(torch.bfloat16),
        "frozen.table": torch.randn(2, 2, generator=g),
    }
    params = {k: torch.nn.Parameter(v, requires_grad=k != "frozen.table") for k, v in params.items()}
    trained = [p for p in params.values() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    for _ in range(3):
        opt.zero_grad()
        loss = sum((p.float() ** 2).sum() * (i + 1) for i, p in enumerate(trained))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        opt.step()
    micro = [[{"input_ids": torch.randint(0, 50000, (2, 8), generator=g), "labels": torch.randint(0, 50000, (2, 8), generator=g)}
              for _ in range(2)] for _ in range(world)]
    prev = b2(b"previous hashed step")
    want, chains, groups = torch_reference(params, opt, world, shards, prev, micro)

    save_file({k: p.detach().contiguous() for k, p in params.items()}, str(tmp_path / "model.safetensors"))
    state = {}
    for name, p in params.items():
        if p in opt.state:
            s = opt.state[p]
            state |= {f"{name}.exp_avg": s["exp_avg"], f"{name}.exp_avg_sq": s["exp_avg_sq"], f"{name}.step": s["step"]}
    assert state["embed.weight.step"].dtype == torch.float32  # torch keeps Adam's step as a float tensor
    save_file(state, str(tmp_path / "optimizer.safetensors"))
    save_file({k: p.grad for k, p in params.items() if p.grad is not None}, str(tmp_path / "gradients.safetensors"))
    for r, c in enumerate(chains):
        (tmp_path / f"batch_hasher.rank_{r}.bin").write_bytes(c)
    meta = {"step": 3, "dp_world_size": world, "dp_shard": shards, "param_groups": json.loads(groups)}
    (tmp_path / "meta.json").write_text(json.dumps(meta))

    result = verify_handoff(tmp_path, expected=want.hex(), prev=prev.hex())
    assert result.verified and result.reconstructed_hash == want.hex()
    assert param_groups_json(meta["param_groups"]).decode() == groups


def test_reader_agrees_with_the_safetensors_library():
    import numpy as np
    from safetensors.numpy import load, save

    rng = np.random.default_rng(5)
    arrays = {"a": rng.standard_normal((3, 4)).astype(np.float32), "b/c": rng.integers(0, 9, (2, 0, 3)).astype(np.int64),
              "d": np.array(7, dtype=np.int32), "e": rng.standard_normal(5).astype(np.float16),
              "f": rng.integers(0, 2, (6,)).astype(np.bool_), "g": rng.standard_normal((2, 2)).astype(np.float64)}
    data = save(arrays, metadata={"k": "v"})
    ours, theirs = read_safetensors(data), load(data)
    codes = {np.float32: "F32", np.int64: "I64", np.int32: "I32", np.float16: "F16", np.bool_: "BOOL", np.float64: "F64"}
    assert set(ours) == set(theirs)
    for name, t in ours.items():
        assert t.shape == theirs[name].shape and bytes(t.data) == theirs[name].tobytes()
        assert t.dtype == codes[theirs[name].dtype.type]


def _file(header: dict, data: bytes) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


@pytest.mark.parametrize("blob", [
    b"\x01\x00",                                                                          # shorter than its length
    struct.pack("<Q", 1 << 40) + b"{}",                                                    # header length out of range
    _file({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4),      # size mismatch
    _file({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 8),      # trailing bytes
    _file({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8),      # a gap
    _file({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
           "b": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4),      # an overlap
    _file({"a": {"dtype": "Q8", "shape": [1], "data_offsets": [0, 1]}}, b"\0"),           # unknown dtype
    _file({"a": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 1]}}, b"\0"),          # negative dimension
    _file({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1], "x": 1}}, b"\0"),   # unknown field
    struct.pack("<Q", 7) + b'{"a": 1' + b"",                                               # not JSON
    struct.pack("<Q", 2) + b"[]",                                                          # not an object
])
def test_reader_refuses_malformed_files(blob):
    with pytest.raises(DecodeError) as info:
        read_safetensors(blob)
    assert info.value.code == "handoff"


def _t(dtype, shape, data):
    return dtype, shape, data


def test_handoff_pairing_errors():
    w = {"w": _t("F32", (2,), b"\0" * 8)}
    ok = {"w.exp_avg": _t("F32", (2,), b"\0" * 8), "w.exp_avg_sq": _t("F32", (2,), b"\0" * 8),
          "w.step": _t("I64", (), struct.pack("<q", 3))}
    model = read_safetensors(write_safetensors(w))
    assert handoff_params(model, read_safetensors(write_safetensors(ok)), {})["w"].optim[0] == 3
    for optimizer, grads, why in [
        ({k: v for k, v in ok.items() if k != "w.step"}, {}, "partial optimizer state"),
        ({**ok, "v.exp_avg": ok["w.exp_avg"]}, {}, "optimizer entry without a weight"),
        (ok, {"v": w["w"]}, "gradient without a weight"),
        (ok, {"w": _t("F32", (1, 2), b"\0" * 8)}, "gradient of another shape"),
        ({**ok, "w.step": _t("F32", (), struct.pack("<f", 2.5))}, {}, "a fractional step"),
        ({**ok, "w.step": _t("F32", (2,), b"\0" * 8)}, {}, "a step of two elements"),
        ({**ok, "w.step": _t("I64", (), struct.pack("<q", -1))}, {}, "a negative step"),
    ]:
        with pytest.raises(DecodeError, match="."):
            handoff_params(model, read_safetensors(write_safetensors(optimizer)), read_safetensors(write_safetensors(grads)))


@pytest.mark.parametrize("meta", [
    [], {"step": 1, "dp_world_size": 1, "dp_shard": 1},
    {"step": 0, "dp_world_size": 1, "dp_shard": 1, "param_groups": []},
    {"step": 1, "dp_world_size": True, "dp_shard": 1, "param_groups": []},
    {"step": 1, "dp_world_size": 1, "dp_shard": 1, "param_groups": [1]},
])
def test_meta_is_checked(meta):
    with pytest.raises(DecodeError):
        HandoffMeta.from_json(meta)


def test_topology_and_chains_are_checked():
    empty = write_safetensors({})
    meta = HandoffMeta(1, 4, 3, ())
    with pytest.raises(DecodeError, match="evenly"):
        handoff_state_hash(meta, bytes(32), empty, empty, empty, [bytes(32)] * 4)
    with pytest.raises(DecodeError, match="chains"):
        handoff_state_hash(HandoffMeta(1, 2, 1, ()), bytes(32), empty, empty, empty, [bytes(32)])
