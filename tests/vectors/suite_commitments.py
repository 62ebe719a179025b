"""Suites ``state_hash``, ``witness``, ``merkle`` and ``trajectory``: the commitments a run is checked against.

``state_hash`` case (docs/run-format.md §3): ``{"description", "tensors": {name: tensor},
"chunk_digests": {name: [hash per chunk]}, "tensor_roots": {name: hash}, "tensor_digests": {name:
hash}, "state_root", "prev", "step", "lr_bits", "batches": [tensor per rank], "batch_digest",
"state_hash", "proofs": {name: tensor proof}, "bad_proofs": [{"why", "name", "tensor", "proof"}],
"chunk_proofs": [{"name", "chunk", "proof"}], "bad_chunk_proofs": [{"why", "name", "chunk", "data_chunk",
"proof"}]}`` where a tensor is ``{"dtype", "shape", "data"}`` (raw little-endian C-order bytes) or
``{"dtype", "shape", "fill": "i mod 251"}`` (byte i of the raw data is i mod 251, for tensors too
large to spell out), ``batches`` may be empty (then the batch digest is 32 zero bytes, as for
h_0), and ``prev`` may be replaced by ``"genesis": {"parameters": typed map, "hash"}``. A tensor
proof is ``{"prev", "step", "lr_bits", "batch_digest", "count", "state_root", "index", "path"}``;
a chunk proof ``{"dtype", "shape", "tensor_root", "path", "tensor": tensor proof}``, checked
against chunk ``chunk`` of the tensor (a bad one presents chunk ``data_chunk``'s bytes). Every
proof verifies against ``state_hash``; every bad one fails.

``witness`` case (docs/run-format.md §5.1): ``{"description", "rule", "loss_bits", "gradients": [{"name",
"tensor"}, ...] (canonical order), "witness", "commitment", "binding": {"run", "step", "signer", "value"}}``,
and for rule v2 the tree's ``"chunk_digests"``, ``"tensor_digests"`` (by name) and ``"root"``.

``merkle`` case: ``{"description", "leaves", "root", "proofs": [[hash, ...] per leaf],
"bad_proofs": [{"index", "size", "leaf", "proof", "why"}]}`` — every bad proof must fail.

``trajectory`` case: ``{"description", "manifest", "trajectory", "result"}``: resolving the
trajectory file against the external manifest gives ``{"state_hashes": [...], "run": hash,
"proofs": [[...] per state hash]}`` or ``{"error": code}``.
"""

from __future__ import annotations

import json

import struct
from pathlib import Path

import pytest

from open1b.protocol import (
    CHUNK_SIZE, ZERO_HASH, ExternalRunManifest, ProtocolError, TensorBytes, TensorProof, batch_digest, blake2b256,
    genesis, merkle_proof, merkle_root, resolve_external_run, state_hash, tensor_digest, tensor_proof,
    verify_merkle_proof, verify_tensor_proof,
)
from open1b.protocol.commitments import ChunkProof, chunk_proof, verify_chunk_proof
from open1b.protocol.witness import (
    WITNESS_SEQUENTIAL, WITNESS_TREE, sequential_witness, tree_witness, witness_binding, witness_commitment,
)  # fmt: skip

from . import fixtures
from .common import hx, ident, typed, unhex, untyped

ITEMSIZE = {"float32": 4, "int32": 4, "int64": 8, "uint8": 1}
FILL = "i mod 251"
LR_BITS = struct.unpack("<I", struct.pack("<f", 1e-3))[0]  # float32(0.001) = 0x3a83126f


def _size(dtype: str, shape: tuple[int, ...]) -> int:
    count = 1
    for d in shape:
        count *= d
    return count * ITEMSIZE[dtype]


def _tensor(name: str, dtype: str, shape: tuple[int, ...]) -> TensorBytes:
    n, raw = _size(dtype, shape), b""
    while len(raw) < n:
        raw += blake2b256(b"vector-tensor", name.encode(), len(raw).to_bytes(8, "little"))
    return TensorBytes(dtype, shape, raw[:n])


def _filled(dtype: str, shape: tuple[int, ...]) -> TensorBytes:
    n = _size(dtype, shape)
    return TensorBytes(dtype, shape, (bytes(range(251)) * (n // 251 + 1))[:n])


def _json_tensor(t: TensorBytes) -> dict:
    if len(t.data) > 4096:  # a large tensor is stored as its rule, and only the fill rule is used
        assert t == _filled(t.dtype, t.shape)
        return {"dtype": t.dtype, "shape": list(t.shape), "fill": FILL}
    return {"dtype": t.dtype, "shape": list(t.shape), "data": hx(t.data)}


def _from_json(t: dict) -> TensorBytes:
    if "fill" in t:
        assert t["fill"] == FILL, t["fill"]
        return _filled(t["dtype"], tuple(t["shape"]))
    return TensorBytes(t["dtype"], tuple(t["shape"]), unhex(t["data"]))


def _json_proof(p: TensorProof) -> dict:
    return {"prev": hx(p.prev), "step": p.step, "lr_bits": p.lr_bits, "batch_digest": hx(p.batch_digest),
            "count": p.count, "state_root": hx(p.state_root), "index": p.index, "path": [hx(x) for x in p.path]}


def _proof_from_json(p: dict) -> TensorProof:
    return TensorProof(unhex(p["prev"]), p["step"], p["lr_bits"], unhex(p["batch_digest"]), p["count"],
                       unhex(p["state_root"]), p["index"], tuple(unhex(x) for x in p["path"]))


def _json_chunk_proof(p: ChunkProof) -> dict:
    return {"dtype": p.dtype, "shape": list(p.shape), "tensor_root": hx(p.tensor_root),
            "path": [hx(x) for x in p.path], "tensor": _json_proof(p.tensor)}


def _chunk_proof_from_json(p: dict) -> ChunkProof:
    return ChunkProof(p["dtype"], tuple(p["shape"]), unhex(p["tensor_root"]), tuple(unhex(x) for x in p["path"]),
                      _proof_from_json(p["tensor"]))


def _chunks(t: TensorBytes) -> list[bytes]:
    raw = bytes(t.data)
    return [raw[i:i + CHUNK_SIZE] for i in range(0, len(raw), CHUNK_SIZE)] or [b""]


def _chunk_digests(t: TensorBytes) -> list[bytes]:
    # the spec's chunk digest, spelled out here so that the vector pins it independently of the code
    return [blake2b256(b"open1b/chunk/v2\x00", struct.pack("<Q", i), c) for i, c in enumerate(_chunks(t))]


def _flip(data: bytes, i: int) -> bytes:
    return data[:i] + bytes([data[i] ^ 1]) + data[i + 1:]


def _case(description: str, tensors: dict[str, TensorBytes], prev: bytes, step: int, lr_bits: int,
          batches: list[TensorBytes], *, bad: bool = False, chunked: str | None = None) -> dict:
    bd = batch_digest(batches) if batches else ZERO_HASH
    h = state_hash(prev, step, tensors, bd, lr_bits=lr_bits)
    proofs = {n: tensor_proof(prev, step, tensors, bd, n, lr_bits=lr_bits) for n in tensors}
    names = sorted(tensors, key=str.encode)
    case = {
        "description": description, "tensors": {n: _json_tensor(t) for n, t in tensors.items()},
        "chunk_digests": {n: [hx(d) for d in _chunk_digests(t)] for n, t in tensors.items()},
        "tensor_roots": {n: hx(merkle_root(_chunk_digests(t))) for n, t in tensors.items()},
        "tensor_digests": {n: hx(tensor_digest(n, t)) for n, t in tensors.items()},
        "state_root": hx(merkle_root([tensor_digest(n, tensors[n]) for n in names])),
        "prev": hx(prev), "step": step, "lr_bits": lr_bits, "batches": [_json_tensor(b) for b in batches],
        "batch_digest": hx(bd), "state_hash": hx(h), "proofs": {n: _json_proof(p) for n, p in proofs.items()},
        "bad_proofs": [], "chunk_proofs": [], "bad_chunk_proofs": [],
    }
    if bad:
        name, other = names[0], names[1]
        t, p = tensors[name], proofs[name]
        flipped = TensorBytes(t.dtype, t.shape, _flip(bytes(t.data), len(t.data) // 2))
        variants = [
            ("one byte of the tensor flipped", name, flipped, p),
            ("the tensor and proof presented under another tensor's name", other, t, p),
            ("the tensor presented with another tensor's proof", name, t, proofs[other]),
            ("the index moved to the next leaf", name, t, TensorProof(**{**p.__dict__, "index": p.index + 1})),
            ("the first sibling of the path altered", name, t,
             TensorProof(**{**p.__dict__, "path": (_flip(p.path[0], 0),) + p.path[1:]})),
            ("the path one sibling short", name, t, TensorProof(**{**p.__dict__, "path": p.path[:-1]})),
            ("a different learning rate claimed", name, t, TensorProof(**{**p.__dict__, "lr_bits": lr_bits ^ 1})),
        ]
        for why, n, tensor, proof in variants:
            assert not verify_tensor_proof(n, tensor, proof, h), why
        case["bad_proofs"] = [{"why": why, "name": n, "tensor": _json_tensor(tensor), "proof": _json_proof(proof)}
                              for why, n, tensor, proof in variants]
    if chunked:
        count = len(_chunks(tensors[chunked]))
        cps = [chunk_proof(prev, step, tensors, bd, chunked, i, lr_bits=lr_bits) for i in range(count)]
        case["chunk_proofs"] = [{"name": chunked, "chunk": i, "proof": _json_chunk_proof(p)} for i, p in enumerate(cps)]
        case["bad_chunk_proofs"] = [
            {"why": "chunk 1's bytes presented as chunk 0", "name": chunked, "chunk": 0, "data_chunk": 1,
             "proof": _json_chunk_proof(cps[0])},
            {"why": "the last chunk's proof used for chunk 0", "name": chunked, "chunk": 0, "data_chunk": 0,
             "proof": _json_chunk_proof(cps[-1])},
        ]
    return case


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
        large = {
            "param/embed": _filled("float32", (640, 1024)),  # 2.5 MiB: chunks of 1 MiB, 1 MiB and 512 KiB
            "param/z": _tensor("z", "float32", (4,)),
            "param/ß": _tensor("sz", "uint8", (3,)),         # sorts after "param/z": 0xc3 > 0x7a
            "empty": TensorBytes("float32", (0, 4), b""),    # no bytes: one empty chunk
        }
        h0 = _case("h_0: prev is the genesis hash of the run parameters, no batch, no learning rate",
                   tensors, g, 0, 0, [])
        h0["genesis"] = {"parameters": typed(params), "hash": h0.pop("prev")}
        return {
            "h0-from-genesis": h0,
            "step-two-ranks": _case("h_5 from h_4, after a step at lr 0.001 that consumed one batch on each of two"
                                    " ranks; proofs that must fail", tensors, fixtures.state(4), 5, LR_BITS, batches,
                                    bad=True),
            "multi-chunk": _case("a 2.5 MiB tensor cut into three chunks, a zero-byte tensor and a non-ASCII name;"
                                 " a proof of every chunk of the large tensor", large, fixtures.state(7), 8, LR_BITS,
                                 batches[:1], chunked="param/embed"),
        }

    @staticmethod
    def check(case: dict, root: Path) -> None:
        tensors = {n: _from_json(t) for n, t in case["tensors"].items()}
        for name, t in tensors.items():
            assert [hx(d) for d in _chunk_digests(t)] == case["chunk_digests"][name]
            assert merkle_root(_chunk_digests(t)) == unhex(case["tensor_roots"][name])
            assert tensor_digest(name, t) == unhex(case["tensor_digests"][name])
        names = sorted(tensors, key=str.encode)
        assert merkle_root([unhex(case["tensor_digests"][n]) for n in names]) == unhex(case["state_root"])
        if "genesis" in case:
            prev = genesis(untyped(case["genesis"]["parameters"]))
            assert prev == unhex(case["genesis"]["hash"])
        else:
            prev = unhex(case["prev"])
        batches = [_from_json(b) for b in case["batches"]]
        bd = batch_digest(batches) if batches else ZERO_HASH
        assert bd == unhex(case["batch_digest"])
        h = unhex(case["state_hash"])
        assert state_hash(prev, case["step"], tensors, bd, lr_bits=case["lr_bits"]) == h
        for name, proof in case["proofs"].items():
            assert verify_tensor_proof(name, tensors[name], _proof_from_json(proof), h), name
            assert tensor_proof(prev, case["step"], tensors, bd, name, lr_bits=case["lr_bits"]) == \
                _proof_from_json(proof)
        for bad in case["bad_proofs"]:
            assert not verify_tensor_proof(bad["name"], _from_json(bad["tensor"]), _proof_from_json(bad["proof"]), h), \
                bad["why"]
        for cp in case["chunk_proofs"]:
            data = _chunks(tensors[cp["name"]])[cp["chunk"]]
            assert verify_chunk_proof(cp["name"], cp["chunk"], data, _chunk_proof_from_json(cp["proof"]), h)
        for bad in case["bad_chunk_proofs"]:
            data = _chunks(tensors[bad["name"]])[bad["data_chunk"]]
            assert not verify_chunk_proof(bad["name"], bad["chunk"], data, _chunk_proof_from_json(bad["proof"]), h), \
                bad["why"]


def _witness_case(description: str, rule: str, loss_bits: int, grads: dict[str, TensorBytes]) -> dict:
    ordered = list(grads.items())  # the canonical parameter order
    if rule == WITNESS_SEQUENTIAL:
        w, tree = sequential_witness(loss_bits, [(n, t.data) for n, t in ordered]), {}
    else:
        w = tree_witness(loss_bits, grads)
        names = sorted(grads, key=str.encode)
        tree = {"chunk_digests": {n: [hx(d) for d in _chunk_digests(t)] for n, t in ordered},
                "tensor_digests": {n: hx(tensor_digest(n, t)) for n, t in ordered},
                "root": hx(merkle_root([tensor_digest(n, grads[n]) for n in names]))}
    run, signer = fixtures.state(1, b"vector-run"), ident(1).public_key
    return {"description": description, "rule": rule, "loss_bits": loss_bits,
            "gradients": [{"name": n, "tensor": _json_tensor(t)} for n, t in ordered], **tree, "witness": hx(w),
            "commitment": hx(witness_commitment(w)),
            "binding": {"run": hx(run), "step": 3, "signer": hx(signer), "value": hx(witness_binding(run, 3, signer, w))}}


class Witness:
    NAME = "witness"

    @staticmethod
    def cases() -> dict[str, dict]:
        loss = struct.unpack("<I", struct.pack("<f", 2.5))[0]
        small = {"wte": _tensor("wte", "float32", (4, 3)), "h0.w": _tensor("h0.w", "float32", (2, 2)),
                 "b": _tensor("b", "float32", (3,))}  # canonical order; sorted by name: b, h0.w, wte
        large = {"wte": _filled("float32", (640, 1024)), **{n: t for n, t in small.items() if n != "wte"}}
        return {
            "sequential": _witness_case("rule v1 (a run without the data key `witness`): one hash over the loss and"
                                        " every gradient in canonical order", WITNESS_SEQUENTIAL, loss, small),
            "tree": _witness_case("rule v2 over the same gradients: the tree of their tensor digests, leaves sorted by"
                                  " name", WITNESS_TREE, loss, small),
            "tree-multi-chunk": _witness_case("rule v2, a 2.5 MiB gradient in three chunks of the state hash's chunking",
                                              WITNESS_TREE, loss, large),
        }

    @staticmethod
    def check(case: dict, root: Path) -> None:
        grads = {g["name"]: _from_json(g["tensor"]) for g in case["gradients"]}
        if case["rule"] == WITNESS_SEQUENTIAL:
            w = sequential_witness(case["loss_bits"], [(n, t.data) for n, t in grads.items()])
        else:
            assert case["rule"] == WITNESS_TREE
            for name, t in grads.items():
                assert [hx(d) for d in _chunk_digests(t)] == case["chunk_digests"][name]
                assert tensor_digest(name, t) == unhex(case["tensor_digests"][name])
            names = sorted(grads, key=str.encode)
            root_hash = merkle_root([unhex(case["tensor_digests"][n]) for n in names])
            assert root_hash == unhex(case["root"])
            w = tree_witness(case["loss_bits"], grads, workers=2)
            assert w == blake2b256(b"open1b/witness/v2\x00", struct.pack("<II", case["loss_bits"], len(grads)), root_hash)
        assert w == unhex(case["witness"])
        assert witness_commitment(w) == unhex(case["commitment"])
        b = case["binding"]
        assert witness_binding(unhex(b["run"]), b["step"], unhex(b["signer"]), w) == unhex(b["value"])


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


# Line rules of the jsonl format (§6.3): a tweak line put after step 0's line of a 3-step log.
LINE_RULES = {
    "line-spaces-and-tabs": ("a line of spaces and tabs only is skipped", " \t "),
    "line-form-feed": ("a line holding a form feed is not blank (JSON whitespace is space, tab, CR, LF)", "\f"),
    "line-nbsp": ("a line holding a no-break space is not blank", "\u00a0"),
    "line-cr-only": ("a line of one CR is blank", "\r"),
    "line-json-spaces": ("spaces around the JSON object are allowed",
                         '  {"step": 1, "state_hash": "' + "AB" * 32 + '"}\t'),
    "step-float": ("a step written 1.0 is not an integer", '{"step": 1.0, "state_hash": "' + "00" * 32 + '"}'),
    "step-exponent": ("a step written 1e0 is not an integer", '{"step": 1e0, "state_hash": "' + "00" * 32 + '"}'),
    "step-negative": ("a negative step", '{"step": -1, "state_hash": "' + "00" * 32 + '"}'),
    "step-negative-zero": ("-0 is the integer 0: it re-logs step 0",
                           '{"step": -0, "state_hash": "' + "00" * 32 + '"}'),
    "step-too-large": ("a step of 2^64", '{"step": 18446744073709551616, "state_hash": "' + "00" * 32 + '"}'),
    "step-largest": ("a step of 2^64 - 1 is allowed (outside the window, ignored)",
                     '{"step": 18446744073709551615, "state_hash": "' + "00" * 32 + '"}'),
    "step-text": ("a step written as text", '{"step": "1", "state_hash": "' + "00" * 32 + '"}'),
    "step-bool": ("a step written true", '{"step": true, "state_hash": "' + "00" * 32 + '"}'),
    "hash-upper-case": ("hex digits of either case; a later line of step 1 supersedes this one",
                        '{"step": 1, "state_hash": "' + "AB" * 32 + '"}'),
    "hash-short": ("a state hash of 63 hex digits", '{"step": 1, "state_hash": "' + "0" * 63 + '"}'),
    "duplicate-key": ("a JSON object with a key twice", '{"step": 1, "step": 1, "state_hash": "' + "00" * 32 + '"}'),
    "not-an-object": ("a line that is a JSON array", "[1]"),
    "no-state-hash": ("a line with a step and no state_hash fails the file (it is not skipped)", '{"step": 1}'),
    "nan": ("NaN is not JSON", '{"step": 1, "state_hash": "' + "00" * 32 + '", "loss": NaN}'),
}


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
        lines = [json.dumps({"step": k, "state_hash": fixtures.state(k, b"line-rules").hex()}) for k in range(3)]
        unterminated = "\n".join(lines).encode()
        variants["last-line-no-lf"] = ("the last line has no LF: it is a line like any other, and holds the window's "
                                       "last step", fixtures.external_manifest(unterminated, first_step=0, steps=2),
                                       unterminated)
        for name, (description, tweak) in LINE_RULES.items():
            lines = [json.dumps({"step": k, "state_hash": fixtures.state(k, b"line-rules").hex()}) for k in range(3)]
            data = ("\n".join(lines[:1] + [tweak] + lines[1:]) + "\n").encode()
            good = ("\n".join(lines) + "\n").encode()
            variants[name] = (description, fixtures.external_manifest(data, first_step=0, steps=2, parse_from=good), data)
        out = {"ok": {
            "description": "an Open-1B-style log (CRLF, blank line, extra keys, step 5 re-logged: the last line wins);"
                           " the run covers log steps 3..9",
            "manifest": hx(ok.encoded), "trajectory": hx(traj),
            "result": {"run": hx(run.run_id), "state_hashes": [hx(h) for h in run.state_hashes],
                       "proofs": [[hx(p) for p in merkle_proof(run.state_hashes, i)] for i in range(len(run.state_hashes))]},
        }}
        for name, (description, manifest, data) in variants.items():
            try:
                resolved = resolve_external_run(manifest, data)
                result = {"run": hx(resolved.run_id), "state_hashes": [hx(h) for h in resolved.state_hashes],
                          "proofs": [[hx(p) for p in merkle_proof(resolved.state_hashes, i)]
                                     for i in range(len(resolved.state_hashes))]}
            except ProtocolError as exc:
                result = {"error": exc.code}
            out[name] = {"description": description, "manifest": hx(manifest.encoded), "trajectory": hx(data),
                         "result": result}
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
