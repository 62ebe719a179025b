"""Suites ``state_hash``, ``merkle`` and ``trajectory``: the commitments a run is checked against.

``state_hash`` case: ``{"description", "tensors": {name: tensor}, "tensor_digests": {name: hash},
"prev", "step", "batches": [tensor per rank], "batch_digest", "state_hash"}`` where a tensor is
``{"dtype", "shape", "data"}`` (raw little-endian C-order bytes), ``batches`` may be empty (then
the batch digest is 32 zero bytes, as for h_0), and ``prev`` may be replaced by ``"genesis":
{"parameters": typed map, "hash"}``.

``merkle`` case: ``{"description", "leaves", "root", "proofs": [[hash, ...] per leaf],
"bad_proofs": [{"index", "size", "leaf", "proof", "why"}]}`` — every bad proof must fail.

``trajectory`` case: ``{"description", "manifest", "trajectory", "result"}``: resolving the
trajectory file against the external manifest gives ``{"state_hashes": [...], "run": hash,
"proofs": [[...] per state hash]}`` or ``{"error": code}``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from open1b.protocol import (
    ZERO_HASH, ExternalRunManifest, ProtocolError, TensorBytes, batch_digest, blake2b256, genesis, merkle_proof,
    merkle_root, resolve_external_run, state_hash, tensor_digest, verify_merkle_proof,
)

from . import fixtures
from .common import hx, typed, unhex, untyped

ITEMSIZE = {"float32": 4, "int32": 4, "int64": 8, "uint8": 1}


def _tensor(name: str, dtype: str, shape: tuple[int, ...]) -> TensorBytes:
    count = 1
    for d in shape:
        count *= d
    raw = b""
    while len(raw) < count * ITEMSIZE[dtype]:
        raw += blake2b256(b"vector-tensor", name.encode(), len(raw).to_bytes(8, "little"))
    return TensorBytes(dtype, shape, raw[:count * ITEMSIZE[dtype]])


def _json_tensor(t: TensorBytes) -> dict:
    return {"dtype": t.dtype, "shape": list(t.shape), "data": hx(t.data)}


def _from_json(t: dict) -> TensorBytes:
    return TensorBytes(t["dtype"], tuple(t["shape"]), unhex(t["data"]))


class StateHash:
    NAME = "state_hash"

    @staticmethod
    def cases() -> dict[str, dict]:
        tensors = {"param/w": _tensor("w", "float32", (3, 2)), "param/b": _tensor("b", "float32", (2,)),
                   "adam/beta1_pow": _tensor("p", "float32", ()), "count": _tensor("c", "int64", (1, 1, 2))}
        params = {"engine": fixtures.ENGINE, "engine_version": fixtures.ENGINE_VERSION, "model": {"d_model": 8},
                  "data": {"corpus": "vectors"}, "seed": 7}
        g = genesis(params)
        batches = [_tensor("rank0", "int32", (2, 5)), _tensor("rank1", "int32", (2, 5))]
        digests = {n: hx(tensor_digest(n, t)) for n, t in tensors.items()}
        common = {"tensors": {n: _json_tensor(t) for n, t in tensors.items()}, "tensor_digests": digests}
        return {
            "h0-from-genesis": {
                "description": "h_0: prev is the genesis hash of the run parameters, no batch", **common,
                "genesis": {"parameters": typed(params), "hash": hx(g)}, "step": 0, "batches": [],
                "batch_digest": hx(ZERO_HASH), "state_hash": hx(state_hash(g, 0, tensors, ZERO_HASH)),
            },
            "step-two-ranks": {
                "description": "h_5 from h_4, after a step that consumed one batch on each of two ranks", **common,
                "prev": hx(fixtures.state(4)), "step": 5, "batches": [_json_tensor(b) for b in batches],
                "batch_digest": hx(batch_digest(batches)),
                "state_hash": hx(state_hash(fixtures.state(4), 5, tensors, batch_digest(batches))),
            },
        }

    @staticmethod
    def check(case: dict, root: Path) -> None:
        tensors = {n: _from_json(t) for n, t in case["tensors"].items()}
        for name, t in tensors.items():
            assert tensor_digest(name, t) == unhex(case["tensor_digests"][name])
        if "genesis" in case:
            prev = genesis(untyped(case["genesis"]["parameters"]))
            assert prev == unhex(case["genesis"]["hash"])
        else:
            prev = unhex(case["prev"])
        batches = [_from_json(b) for b in case["batches"]]
        bd = batch_digest(batches) if batches else ZERO_HASH
        assert bd == unhex(case["batch_digest"])
        assert state_hash(prev, case["step"], tensors, bd) == unhex(case["state_hash"])


class Merkle:
    NAME = "merkle"

    @staticmethod
    def cases() -> dict[str, dict]:
        out = {}
        for size in (1, 2, 3, 5, 7, 8):
            leaves = [fixtures.state(i, b"vector-leaf") for i in range(size)]
            root = merkle_root(leaves)
            proofs = [merkle_proof(leaves, i) for i in range(size)]
            last = proofs[-1]
            bad = [
                {"index": 0, "size": size, "leaf": hx(blake2b256(b"not a leaf")), "proof": [hx(p) for p in proofs[0]],
                 "why": "a different leaf"},
                {"index": size, "size": size, "leaf": hx(leaves[-1]), "proof": [hx(p) for p in last],
                 "why": "index outside the tree"},
                {"index": size - 1, "size": size, "leaf": hx(leaves[-1]), "proof": [hx(p) for p in last + [root]],
                 "why": "one sibling too many"},
            ]
            if last:
                bad.append({"index": size - 1, "size": size, "leaf": hx(leaves[-1]), "proof": [hx(p) for p in last[:-1]],
                            "why": "one sibling too few"})
            if size > 1:
                bad.append({"index": size - 1, "size": size + 1, "leaf": hx(leaves[-1]), "proof": [hx(p) for p in last],
                            "why": "the last leaf's proof, claimed for a tree one leaf larger"})
                bad.append({"index": 0, "size": size, "leaf": hx(leaves[1]), "proof": [hx(p) for p in proofs[1]],
                            "why": "leaf 1 and its proof presented as leaf 0"})
            out[f"size-{size}"] = {
                "description": f"a tree of {size} leaves (leaf i = B2('vector-leaf' ‖ u64le(i)))",
                "leaves": [hx(v) for v in leaves], "root": hx(root), "proofs": [[hx(p) for p in pr] for pr in proofs],
                "bad_proofs": bad,
            }
        return out

    @staticmethod
    def check(case: dict, root: Path) -> None:
        leaves = [unhex(v) for v in case["leaves"]]
        top = unhex(case["root"])
        assert merkle_root(leaves) == top
        for i, proof in enumerate(case["proofs"]):
            assert merkle_proof(leaves, i) == [unhex(p) for p in proof]
            assert verify_merkle_proof(leaves[i], i, len(leaves), [unhex(p) for p in proof], top)
        for bad in case["bad_proofs"]:
            assert not verify_merkle_proof(unhex(bad["leaf"]), bad["index"], bad["size"],
                                           [unhex(p) for p in bad["proof"]], top), bad["why"]


class Trajectory:
    NAME = "trajectory"

    @staticmethod
    def cases() -> dict[str, dict]:
        traj = fixtures.trajectory_file()
        ok = fixtures.external_manifest(traj)
        run = resolve_external_run(ok, traj)
        bad = traj + b'{"step": 13, "state_hash": "xyz"}\n'
        variants = {
            "digest-mismatch": ("a file one byte longer than the manifest commits to", ok, traj + b"\n"),
            "window-missing": ("the window reaches past the log's last step",
                               fixtures.external_manifest(traj, first_step=8, steps=6), traj),
            "root-mismatch": ("the manifest's Merkle root is not the window's",
                              fixtures.external_manifest(traj, root=bytes(32)), traj),
            "malformed-line": ("a line whose state_hash is not 64 hex digits", 
                               fixtures.external_manifest(bad, steps=1, parse_from=traj), bad),
        }
        out = {"ok": {
            "description": "an Open-1B-style log (CRLF, blank line, extra keys, step 5 re-logged: the last line wins);"
                           " the run covers log steps 3..9",
            "manifest": hx(ok.encoded), "trajectory": hx(traj),
            "result": {"run": hx(run.run_id), "state_hashes": [hx(h) for h in run.state_hashes],
                       "proofs": [[hx(p) for p in merkle_proof(run.state_hashes, i)] for i in range(len(run.state_hashes))]},
        }}
        for name, (description, manifest, data) in variants.items():
            try:
                resolve_external_run(manifest, data)
                raise AssertionError(f"{name} resolved")
            except ProtocolError as exc:
                code = exc.code
            out[name] = {"description": description, "manifest": hx(manifest.encoded), "trajectory": hx(data),
                         "result": {"error": code}}
        return out

    @staticmethod
    def check(case: dict, root: Path) -> None:
        manifest = ExternalRunManifest.decode(unhex(case["manifest"]))
        data = unhex(case["trajectory"])
        if "error" in case["result"]:
            with pytest.raises(ProtocolError) as info:
                resolve_external_run(manifest, data)
            assert info.value.code == case["result"]["error"]
            return
        run = resolve_external_run(manifest, data)
        assert run.run_id == unhex(case["result"]["run"])
        assert [hx(h) for h in run.state_hashes] == case["result"]["state_hashes"]
        for i, proof in enumerate(case["result"]["proofs"]):
            assert manifest.proves(i, run.state_hashes[i], [unhex(p) for p in proof])
