"""``open1b-node train``: a run trained by W processes is replayed, step by step, by one."""

import json

import pytest

from open1b.deterministic.runfile import read_manifest

from .commands import cli

pytestmark = pytest.mark.integration


def test_train_with_two_ranks_then_replay_each_step_in_one_process(tmp_path):
    run_dir, data_dir = tmp_path / "run", tmp_path / "node"
    rc, out, err = cli("train", "--steps", "2", "--ranks", "2", "--seed", "3", "--out", str(run_dir),
                       "--data-dir", str(data_dir), "--json", timeout=600)
    assert rc == 0, err
    summary = json.loads(out)
    assert summary["ranks"] == 2 and summary["steps"] == 2
    assert summary["fingerprints"] == read_manifest(run_dir).data["fingerprints_root"]  # recorded by default
    assert (run_dir / "fingerprints.cbor").is_file()
    for step in range(2):
        rc, out, err = cli("replay", str(run_dir), "--step", str(step), "--data-dir", str(data_dir), "--json", timeout=600)
        assert rc == 0 and json.loads(out)["verdict"] == "match", err


def test_train_with_and_without_fingerprints_into_the_same_directory(tmp_path):
    run_dir, data_dir = tmp_path / "run", tmp_path / "node"
    rc, out, err = cli("train", "--steps", "1", "--no-fingerprints", "--out", str(run_dir), "--data-dir",
                       str(data_dir), "--json", timeout=600)
    assert rc == 0, err
    assert json.loads(out)["fingerprints"] == "none" and "fingerprints_root" not in read_manifest(run_dir).data
    assert not (run_dir / "fingerprints.cbor").exists()
    rc, out, err = cli("train", "--steps", "1", "--out", str(run_dir), "--data-dir", str(data_dir), "--json",
                       timeout=600)
    assert rc == 0, err
    assert json.loads(out)["fingerprints"] == read_manifest(run_dir).data["fingerprints_root"]
    # and a run without them in its place leaves no stale file behind
    rc, _, err = cli("train", "--steps", "1", "--no-fingerprints", "--out", str(run_dir), "--data-dir", str(data_dir),
                     timeout=600)
    assert rc == 0 and not (run_dir / "fingerprints.cbor").exists(), err


@pytest.mark.parametrize("ranks", ["0", "-2", "two"])
def test_train_refuses_a_rank_count_below_one(tmp_path, ranks):
    rc, _, err = cli("train", "--steps", "1", "--ranks", ranks, "--out", str(tmp_path / "run"),
                     "--data-dir", str(tmp_path / "node"), timeout=60)
    assert rc == 2 and "--ranks" in err
    assert not (tmp_path / "run").exists()


def test_replay_out_writes_the_replayed_state_byte_for_byte(tmp_path):
    """``replay --out FILE`` (CPU): the replayed state k+1 as a checkpoint file whose bytes are the
    trainer's, so its blob address is the manifest's."""
    from open1b.protocol.hashing import blake2b256

    run_dir, data_dir, out = tmp_path / "run", tmp_path / "node", tmp_path / "replayed" / "state1.safetensors"
    rc, _, err = cli("train", "--steps", "1", "--seed", "5", "--out", str(run_dir), "--data-dir", str(data_dir),
                     "--json", timeout=600)
    assert rc == 0, err
    out.parent.mkdir()
    rc, stdout, err = cli("replay", str(run_dir), "--step", "0", "--device", "cpu", "--out", str(out),
                          "--data-dir", str(data_dir), "--json", timeout=600)
    assert rc == 0 and json.loads(stdout)["verdict"] == "match", err
    assert blake2b256(out.read_bytes()) == read_manifest(run_dir).checkpoints[1]
    assert out.read_bytes() == (run_dir / "checkpoints" / "00000001.safetensors").read_bytes()
    assert [p.name for p in out.parent.iterdir()] == [out.name]  # no temporary file left beside it
