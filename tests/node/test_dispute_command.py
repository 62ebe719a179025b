"""``open1b-node dispute verify PROOF``: the referee's verdict on the `dispute` vectors' proofs, as
text and JSON from one result, with examples/verify_fraud_proof.py's exit codes; a file that is
not a proof is a verdict or one line, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from open1b.node.cli import main
from open1b.protocol.dispute import MAX_FRAUD_PROOF_SIZE
from open1b.protocol.hashing import blake2b256
from tests.vectors import ROOT as VECTORS

CASES = sorted(p.stem for p in (VECTORS / "dispute").glob("*.json"))


def _proof(tmp_path, case: str) -> tuple[dict, bytes, str]:
    vector = json.loads((VECTORS / "dispute" / f"{case}.json").read_text())
    data = bytes.fromhex(vector["proof"][2:])
    path = tmp_path / f"{case}.cbor"
    path.write_bytes(data)
    return vector, data, str(path)


@pytest.mark.parametrize("case", CASES)
def test_every_vector_judged_as_the_vector_says_with_the_examples_exit_code(tmp_path, capsys, case):
    vector, data, path = _proof(tmp_path, case)
    status = {"accept": 0, "reject": 2, "ignore": 3}[vector["outcome"]]
    assert main(["dispute", "verify", path, "--json"]) == status
    out = json.loads(capsys.readouterr().out)
    assert (out["outcome"], out["code"], out["guilty"], out["op"], out["position"]) == (
        vector["outcome"], vector["code"], vector["guilty"], vector["op"], vector["position"])
    assert (out["proof"], out["bytes"]) == (blake2b256(data).hex(), len(data))
    assert main(["dispute", "verify", path]) == status
    text = capsys.readouterr().out
    if status == 0:  # who, which op and where, and why
        assert text.startswith(f"GUILTY {', '.join(vector['guilty'])}\n")
        assert f"step {out['step']}, op {vector['position']} ({vector['op']}): {vector['code']}" in text
    else:
        assert text.startswith(("REFUSED " if status == 2 else "CANNOT JUDGE ") + vector["code"] + ":")
        assert text.count("\n") == 1


def test_true_convicts_and_forged_is_refused(tmp_path, capsys):
    """The pair the issue names, told apart: the same op, one proof honest, one with a bit flipped."""
    _, _, true = _proof(tmp_path, "matmul-true")
    _, _, forged = _proof(tmp_path, "matmul-forged")
    assert main(["dispute", "verify", true]) == 0
    assert main(["dispute", "verify", forged]) == 2
    first, second = capsys.readouterr().out.split("GUILTY ", 1)[1].split("REFUSED ")
    assert "(matmul): guilty" in first and second.startswith("reads:")


def test_the_console_script_judges_a_proof_in_a_process_of_its_own(tmp_path):
    vector, _, path = _proof(tmp_path, "gelu-true")
    script = os.path.join(os.path.dirname(sys.executable), "open1b-node")
    proc = subprocess.run([script, "dispute", "verify", path, "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["guilty"] == vector["guilty"]


def test_hostile_files_are_one_line_or_one_verdict(tmp_path, capsys):
    (tmp_path / "garbage").write_bytes(b"\xff" * 100)
    (tmp_path / "empty").write_bytes(b"")
    with open(tmp_path / "huge", "wb") as f:  # sparse: refused by its size, never read
        f.truncate(MAX_FRAUD_PROOF_SIZE + 1)
    os.mkfifo(tmp_path / "fifo")
    _, _, true = _proof(tmp_path, "add-true")
    (tmp_path / "link").symlink_to(true)
    for name, why in (("huge", "more than the"), ("fifo", "not a regular file"), ("link", "a symbolic link"),
                      ("missing", "No such file")):
        assert main(["dispute", "verify", str(tmp_path / name)]) == 1
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.count("\n") == 1, captured
        assert captured.err.startswith("open1b-node: error: cannot read the proof") and why in captured.err
    for name, code in (("garbage", "non_canonical"), ("empty", "malformed")):
        assert main(["dispute", "verify", str(tmp_path / name)]) == 2
        captured = capsys.readouterr()
        assert captured.err == "" and captured.out.startswith(f"REFUSED {code}:") and captured.out.count("\n") == 1
        assert main(["dispute", "verify", str(tmp_path / name), "--json"]) == 2
        assert json.loads(capsys.readouterr().out)["outcome"] == "reject"
    assert main(["dispute", "verify", str(tmp_path / "link"), "--follow"]) == 0  # a link, when asked
