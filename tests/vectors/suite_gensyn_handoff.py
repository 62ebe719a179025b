"""Suite ``gensyn_handoff``: Gensyn Open-1B's v3 state hash, and hand-off directories to verify.

Built from the written description of the hash (docs/protocol.md, "Open-1B v3 state hash"),
not from Open-1B's files. Two kinds of case:

``records``: ``{"description", "records": [{"tag", "tensor", "header"}]}`` — ``header`` is the
bytes T(tag, t) puts before the tensor's raw data (tag ‖ dtype ‖ 0x00 ‖ shape ‖ 0x00); a
tensor here is ``{"dtype": safetensors code, "shape", "data"}``.

``handoff-*``: ``{"description", "dir", "log", "step", "prev", "expected", "micro_batches",
"shard_digests", "shard_state", "param_groups_json", "batch_digest"}`` — ``dir`` is a hand-off
directory beside the case (meta.json, model/optimizer/gradients.safetensors,
batch_hasher.rank_<r>.bin); ``log`` a state_hashes.jsonl holding ``expected`` at ``step`` and
``prev`` at the previous hashed step; ``micro_batches[r]`` the micro-batches rank r consumed, in
order, whose chain (from 32 zero bytes) is that rank's batch_hasher file.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from open1b.protocol import blake2b256
from open1b.protocol.gensyn_handoff import (
    BATCH_CHAIN_INIT, DTYPES, HandoffMeta, Tensor, batch_chain, batch_digest, handoff_params, handoff_state_hash,
    param_groups_json, read_safetensors, shard_digest, shard_state,
)

from .common import hx, unhex

NAME = "gensyn_handoff"

PARAM_GROUPS = [{"params": [0, 1, 2, 3], "lr": 0.0003, "betas": [0.9, 0.95], "eps": 1e-08, "weight_decay": 0.1,
                 "amsgrad": False, "foreach": None, "maximize": False, "capturable": False, "differentiable": False,
                 "fused": None, "decoupled_weight_decay": True, "initial_lr": 0.0003}]


def _raw(label: str, size: int) -> bytes:
    out = b""
    while len(out) < size:
        out += blake2b256(b"open1b-v3-vector", label.encode(), len(out).to_bytes(8, "little"))
    return out[:size]


def _t(label: str, dtype: str, shape: tuple[int, ...], data: bytes | None = None) -> tuple[str, tuple[int, ...], bytes]:
    count = 1
    for d in shape:
        count *= d
    return dtype, shape, data if data is not None else _raw(label, count * DTYPES[dtype][1])


def write_safetensors(tensors: dict[str, tuple[str, tuple[int, ...], bytes]]) -> bytes:
    """A safetensors file: entries in name order, data contiguous, header padded to 8 bytes."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        dtype, shape, data = tensors[name]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def _json_tensor(t: tuple[str, tuple[int, ...], bytes]) -> dict:
    return {"dtype": t[0], "shape": list(t[1]), "data": hx(t[2])}


def _tensor(j: dict) -> Tensor:
    return Tensor(j["dtype"], tuple(j["shape"]), memoryview(unhex(j["data"])))


HANDOFFS = {
    "handoff-1rank": dict(
        description="one rank, no sharding; step 1, so the chain folds in 32 zero bytes (a cold start); a frozen "
                    "weight without optimizer state or gradient; a 0-dim parameter; a bf16 weight",
        step=1, world=1, shards=1, step_dtype="F32",
        params={"embed.weight": ("F32", (5, 3)), "layers.0.norm.weight": ("F32", (3,)), "layers.0.scale": ("F32", ()),
                "lm_head.weight": ("BF16", (4, 3)), "frozen.weight": ("F32", (2, 2))},
        frozen={"frozen.weight"}, micro_batches=2),
    "handoff-hsdp": dict(
        description="HSDP: 4 ranks holding 2 shards (rank r holds shard r mod 2); 5 rows split 3 + 2, one row "
                    "split 1 + 0 (an empty shard); Adam's step stored as int64; step 7, chained from step 6",
        step=7, world=4, shards=2, step_dtype="I64",
        params={"wte.weight": ("F32", (5, 4)), "blocks.0.attn.qkv.weight": ("BF16", (6, 4)),
                "blocks.0.ln.bias": ("F32", (1, 4)), "blocks.0.gain": ("F32", ())},
        frozen=set(), micro_batches=3),
}


def _handoff(name: str, spec: dict) -> tuple[dict, dict[str, bytes]]:
    step = spec["step"]
    model, optim, grads = {}, {}, {}
    for p, (dtype, shape) in spec["params"].items():
        model[p] = _t(f"{name}/{p}/w", dtype, shape)
        if p in spec["frozen"]:
            continue
        optim[p + ".exp_avg"] = _t(f"{name}/{p}/m", "F32", shape)
        optim[p + ".exp_avg_sq"] = _t(f"{name}/{p}/v", "F32", shape)
        optim[p + ".step"] = _t("", spec["step_dtype"], (), struct.pack("<f" if spec["step_dtype"] == "F32" else "<q", step))
        grads[p] = _t(f"{name}/{p}/g", "F32", shape)
    micro = [[{"input_ids": _t(f"{name}/r{r}/mb{i}/x", "I64", (2, 6)), "labels": _t(f"{name}/r{r}/mb{i}/y", "I64", (2, 6))}
              for i in range(spec["micro_batches"])] for r in range(spec["world"])]
    chains = []
    for rank in micro:
        c = BATCH_CHAIN_INIT
        for mb in rank:
            c = batch_chain(c, {k: Tensor(d, s, memoryview(b)) for k, (d, s, b) in mb.items()})
        chains.append(c)
    meta = {"step": step, "dp_world_size": spec["world"], "dp_shard": spec["shards"], "param_groups": PARAM_GROUPS}
    files = {"meta.json": (json.dumps(meta, indent=1, sort_keys=True) + "\n").encode(),
             "model.safetensors": write_safetensors(model), "optimizer.safetensors": write_safetensors(optim),
             "gradients.safetensors": write_safetensors(grads)}
    files.update({f"batch_hasher.rank_{r}.bin": c for r, c in enumerate(chains)})
    prev = blake2b256(b"open1b-v3-vector/log", bytes([step - 1])) if step > 1 else bytes(32)
    hm = HandoffMeta.from_json(meta)
    expected = handoff_state_hash(hm, prev, files["model.safetensors"], files["optimizer.safetensors"],
                                  files["gradients.safetensors"], chains)
    params = handoff_params(*(read_safetensors(files[f]) for f in ("model.safetensors", "optimizer.safetensors",
                                                                 "gradients.safetensors")))
    log_steps = {s: blake2b256(b"open1b-v3-vector/log", bytes([s])) for s in range(0, step + 2)}
    log_steps[step] = expected
    if step > 1:
        log_steps[step - 1] = prev
    log = "".join(json.dumps({"step": s, "state_hash": h.hex()}) + "\n" for s, h in sorted(log_steps.items()))
    case = {
        "description": spec["description"], "dir": name, "log": f"{name}.state_hashes.jsonl", "step": step,
        "prev": hx(prev), "expected": hx(expected),
        "micro_batches": [[{k: _json_tensor(t) for k, t in mb.items()} for mb in rank] for rank in micro],
        "shard_digests": [hx(shard_digest(params, i, spec["shards"])) for i in range(spec["shards"])],
        "shard_state": hx(shard_state(params, spec["world"], spec["shards"])),
        "param_groups_json": param_groups_json(PARAM_GROUPS).decode(), "batch_digest": hx(batch_digest(chains)),
    }
    out = {f"{name}/{f}": data for f, data in files.items()}
    out[f"{name}.state_hashes.jsonl"] = log.encode()
    return case, out


def cases() -> dict[str, dict]:
    records = []
    for tag, t in [(b"weight\x00", _t("a", "F32", (17, 4))), (b"grad\x00", _t("b", "BF16", (3,))),
                   (b"optim_exp_avg\x00", _t("c", "F32", ())), (b"input_ids\x00", _t("d", "I64", (2, 0, 5)))]:
        tensor = Tensor(t[0], t[1], memoryview(t[2]))
        records.append({"tag": hx(tag), "tensor": _json_tensor(t), "header": hx(tensor.header(tag))})
    out = {"records": {"description": "T(tag, t) headers: torch dtype names and Python tuple reprs", "records": records}}
    for name, spec in HANDOFFS.items():
        out[name] = _handoff(name, spec)[0]
    return out


def files() -> dict[str, bytes]:
    out = {}
    for name, spec in HANDOFFS.items():
        out.update(_handoff(name, spec)[1])
    return out


def check(case: dict, root: Path) -> None:
    if "records" in case:
        for r in case["records"]:
            assert _tensor(r["tensor"]).header(unhex(r["tag"])) == unhex(r["header"])
        return
    d = root / case["dir"]
    meta = HandoffMeta.from_json(json.loads((d / "meta.json").read_text()))
    chains = []
    for r, rank in enumerate(case["micro_batches"]):
        c = BATCH_CHAIN_INIT
        for mb in rank:
            c = batch_chain(c, {k: _tensor(t) for k, t in mb.items()})
        assert (d / f"batch_hasher.rank_{r}.bin").read_bytes() == c
        chains.append(c)
    assert batch_digest(chains) == unhex(case["batch_digest"])
    assert param_groups_json(meta.param_groups).decode() == case["param_groups_json"]
    blobs = [(d / f).read_bytes() for f in ("model.safetensors", "optimizer.safetensors", "gradients.safetensors")]
    params = handoff_params(*(read_safetensors(b) for b in blobs))
    assert [hx(shard_digest(params, i, meta.dp_shard)) for i in range(meta.dp_shard)] == case["shard_digests"]
    assert shard_state(params, meta.dp_world_size, meta.dp_shard) == unhex(case["shard_state"])
    assert handoff_state_hash(meta, unhex(case["prev"]), *blobs, chains) == unhex(case["expected"])
    log = {json.loads(line)["step"]: json.loads(line)["state_hash"] for line in (root / case["log"]).read_text().splitlines()}
    assert log[case["step"]] == case["expected"][2:]
