"""``open1b-node samples RUN --step K``: which samples step K used, proven against the manifest.

The run is built here from its parts (the samples file and a signed manifest that commits to
it); the samples command reads nothing else, so no training is needed.
"""

import hashlib
import json

import pytest

from open1b.deterministic import PRESETS
from open1b.deterministic.config import to_manifest_model
from open1b.deterministic.data import BUILTIN_CORPUS, DATA_ORDER, TOKENIZER, builtin_dataset
from open1b.deterministic.provenance import write_run_samples
from open1b.deterministic.runfile import MANIFEST_FILE, SAMPLES_FILE
from open1b.node.cli import main
from open1b.protocol import Identity, blake2b256
from open1b.protocol.merkle import verify_merkle_proof
from tests.runs import run_manifest

from .test_data_order import spec_index

TINY = PRESETS["tiny"]
SEED = 3


def make_run(run_dir, *, order=DATA_ORDER):
    ds = builtin_dataset(TINY.config)
    fields = write_run_samples(run_dir, ds)
    blob = blake2b256((run_dir / SAMPLES_FILE).read_bytes())
    assert fields == {"samples_root": ds.root, "samples": ds.n, "samples_blob": blob, "samples_size": 32 + ds.n * 33}
    manifest = run_manifest(
        Identity(blake2b256(b"tests/data-cli")), engine="open1b-gpt", engine_version="test",
        model=to_manifest_model("tiny", TINY.config, TINY.topology), seed=SEED, steps=4,
        data={"corpus": BUILTIN_CORPUS, "tokenizer": TOKENIZER, "order": order, "schedule": "constant"},
        state_hashes=[bytes(32)] * 5, created_at=1, **fields,
    )  # fmt: skip
    (run_dir / MANIFEST_FILE).write_bytes(manifest.encoded)
    return ds, manifest


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_json_lists_every_row_with_a_proof_that_verifies(tmp_path, capsys):
    ds, manifest = make_run(tmp_path)
    code, out, _ = run_cli(capsys, "samples", str(tmp_path), "--step", "2", "--json")
    assert code == 0
    got = json.loads(out)
    assert got["run"] == manifest.run_id.hex() and got["step"] == 2 and got["verified"] is True
    assert got["samples"] == ds.n and got["samples_root"] == ds.root.hex()
    topo = TINY.topology
    expected_rows = [(r, m, j) for r in range(topo.ranks) for m in range(topo.micro_batches)
                     for j in range(topo.micro_batch_size)]  # fmt: skip
    assert [(u["rank"], u["micro_batch"], u["row"]) for u in got["uses"]] == expected_rows
    for u in got["uses"]:
        i = u["index"]
        assert i == spec_index(SEED, 2, u["rank"], u["micro_batch"], u["row"], ds.n)
        row = ds.samples[i].tobytes()
        digest = hashlib.blake2b(b"open1b/sample/v1\x00\x01" + row, digest_size=32).digest()
        assert u["digest"] == digest.hex()
        proof = [bytes.fromhex(p) for p in u["proof"]]
        assert verify_merkle_proof(digest, i, manifest.samples, proof, manifest.samples_root)


def test_one_rank_and_text_output(tmp_path, capsys):
    make_run(tmp_path)
    code, out, _ = run_cli(capsys, "samples", str(tmp_path), "--step", "0", "--rank", "1", "--json")
    assert code == 0 and {u["rank"] for u in json.loads(out)["uses"]} == {1} and len(json.loads(out)["uses"]) == 4
    code, out, _ = run_cli(capsys, "samples", str(tmp_path), "--step", "0")
    assert code == 0 and "every proof verified" in out and out.count("micro-batch") == 8


@pytest.mark.parametrize("argv, message", [
    (["--step", "4"], "outside the run's 4 steps"),
    (["--step", "0", "--rank", "2"], "rank 2 is outside"),
])  # fmt: skip
def test_out_of_range_requests_are_refused(tmp_path, capsys, argv, message):
    make_run(tmp_path)
    code, out, err = run_cli(capsys, "samples", str(tmp_path), *argv)
    assert code == 1 and out == "" and message in err


def test_a_tampered_samples_file_or_another_order_is_refused(tmp_path, capsys):
    make_run(tmp_path)
    path = tmp_path / SAMPLES_FILE
    data = bytearray(path.read_bytes())
    data[1000] ^= 0x01  # same size, same header: caught by the blob address before anything is proven
    path.write_bytes(bytes(data))
    code, out, err = run_cli(capsys, "samples", str(tmp_path), "--step", "0", "--json")
    assert code == 1 and out == "" and "not the blob the run names" in err
    other = tmp_path / "v1"
    other.mkdir()
    make_run(other, order="open1b/data/v1")
    code, out, err = run_cli(capsys, "samples", str(other), "--step", "0")
    assert code == 1 and "data order 'open1b/data/v1'" in err
