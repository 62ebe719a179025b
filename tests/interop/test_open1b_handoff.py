"""``open1b-node verify-handoff`` on the Open-1B hand-off fixtures of tests/vectors/gensyn_handoff."""

import json
import shutil
import subprocess
import sys

import pytest

from ..vectors import ROOT

FIXTURES = ROOT / "gensyn_handoff"
CASES = ["handoff-1rank", "handoff-hsdp"]


def cli(*args):
    proc = subprocess.run([sys.executable, "-m", "open1b.node.cli", "verify-handoff", *map(str, args)],
                          capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def case(name):
    return json.loads((FIXTURES / f"{name}.json").read_text())


@pytest.mark.parametrize("name", CASES)
def test_a_handoff_matches_its_published_log(name):
    c = case(name)
    rc, out, err = cli(FIXTURES / c["dir"], "--state-hashes", FIXTURES / c["log"], "--json")
    assert rc == 0, err
    result = json.loads(out)
    assert result["verified"] and result["reconstructed_hash"] == result["expected_hash"] == c["expected"][2:]
    assert result["prev_hash"] == c["prev"][2:] and result["step"] == c["step"]
    rc, out, _ = cli(FIXTURES / c["dir"], "--expected", c["expected"][2:], "--prev", c["prev"][2:])
    assert rc == 0 and "verdict        MATCH" in out


def test_one_flipped_bit_anywhere_is_a_mismatch(tmp_path):
    c = case("handoff-hsdp")
    for victim in ("model.safetensors", "optimizer.safetensors", "gradients.safetensors", "batch_hasher.rank_3.bin"):
        copy = tmp_path / victim
        shutil.copytree(FIXTURES / c["dir"], copy)
        data = bytearray((copy / victim).read_bytes())
        data[-1] ^= 1  # the last byte is tensor data (or chain bytes): still a well-formed file
        (copy / victim).write_bytes(bytes(data))
        rc, out, err = cli(copy, "--state-hashes", FIXTURES / c["log"], "--json")
        assert rc == 2, (victim, err)
        assert json.loads(out)["reconstructed_hash"] != c["expected"][2:]
    rc, _, _ = cli(FIXTURES / c["dir"], "--expected", c["expected"][2:], "--prev", "00" * 32)
    assert rc == 2  # the right state chained from the wrong previous hash


def test_the_authors_own_claim_is_never_read(tmp_path):
    c = case("handoff-1rank")
    copy = tmp_path / "h"
    shutil.copytree(FIXTURES / c["dir"], copy)
    (copy / "state_hash.txt").write_text("ff" * 32 + "\n")
    rc, out, _ = cli(copy, "--state-hashes", FIXTURES / c["log"], "--json")
    assert rc == 0 and json.loads(out)["expected_hash"] == c["expected"][2:]


def test_errors_exit_1_and_say_what_is_missing(tmp_path):
    c = case("handoff-hsdp")
    copy = tmp_path / "h"
    shutil.copytree(FIXTURES / c["dir"], copy)
    (copy / "batch_hasher.rank_2.bin").unlink()
    rc, _, err = cli(copy, "--state-hashes", FIXTURES / c["log"])
    assert rc == 1 and "batch_hasher.rank_2.bin" in err
    rc, _, err = cli(FIXTURES / c["dir"])
    assert rc == 1 and "--expected" in err
    rc, _, err = cli(FIXTURES / c["dir"], "--expected", "abc")
    assert rc == 1 and "64 hex digits" in err
    (tmp_path / "log.jsonl").write_text(json.dumps({"step": c["step"], "state_hash": "00" * 32}) + "\n")
    rc, _, err = cli(FIXTURES / c["dir"], "--state-hashes", tmp_path / "log.jsonl")
    assert rc == 1 and "previous hash" in err  # step 7 needs the hash of an earlier step
