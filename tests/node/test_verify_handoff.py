"""``verify-handoff`` on broken hand-offs, as a new user would try them: each is a one-line error
and exit code 1, never a traceback; the optional files of docs/protocol.md §14.2 may be absent."""

from __future__ import annotations

import json
import shutil

import pytest

from open1b.node import cli
from open1b.node.verify_handoff import EMPTY_SAFETENSORS, HandoffError, verify_handoff

from ..vectors import ROOT

FIXTURES = ROOT / "gensyn_handoff"


def case(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


@pytest.fixture
def handoff(tmp_path):
    c = case("handoff-hsdp")
    copy = tmp_path / "h"
    shutil.copytree(FIXTURES / c["dir"], copy)
    return copy, c


def run_cli(capsys, directory, c) -> tuple[int, str]:
    rc = cli.main(["verify-handoff", str(directory), "--state-hashes", str(FIXTURES / c["log"])])
    return rc, capsys.readouterr().err


def test_a_truncated_safetensors_file_is_a_one_line_error(handoff, capsys):
    directory, c = handoff
    for name in ("model.safetensors", "optimizer.safetensors", "gradients.safetensors"):
        data = (FIXTURES / c["dir"] / name).read_bytes()
        for cut in (3, 8, 40, len(data) - 1):
            (directory / name).write_bytes(data[:cut])
            rc, err = run_cli(capsys, directory, c)
            assert rc == 1 and err.count("\n") == 1 and "safetensors" in err, (name, cut, err)
            assert "BufferError" not in err
        (directory / name).write_bytes(data)
    with pytest.raises(HandoffError, match="safetensors"):  # the real error, not one from closing the maps
        (directory / "model.safetensors").write_bytes(b"\x10" + bytes(7) + b"{not json")
        verify_handoff(directory, expected=c["expected"][2:], prev=c["prev"][2:])


def test_a_deeply_nested_meta_json_is_a_one_line_error(handoff, capsys):
    directory, c = handoff
    for text in ("[" * 100_000 + "]" * 100_000, '{"step": ' + "[" * 5000 + "]" * 5000 + "}", "not json", "[]"):
        (directory / "meta.json").write_text(text)
        rc, err = run_cli(capsys, directory, c)
        assert rc == 1 and err.count("\n") == 1 and "meta.json" in err, err


def test_optimizer_and_gradients_files_may_be_absent(handoff, capsys):
    """docs/protocol.md §14.2: absent means no optimizer state and grad_none — exactly what a file
    holding no tensors says."""
    directory, c = handoff
    kw = dict(expected=c["expected"][2:], prev=c["prev"][2:])
    for name in ("optimizer.safetensors", "gradients.safetensors"):
        (directory / name).unlink()
    absent = verify_handoff(directory, **kw)
    for name in ("optimizer.safetensors", "gradients.safetensors"):
        (directory / name).write_bytes(EMPTY_SAFETENSORS)
    empty = verify_handoff(directory, **kw)
    assert absent.reconstructed_hash == empty.reconstructed_hash and not absent.verified  # the fixture has both
    rc, err = run_cli(capsys, directory, c)
    assert rc == 2 and err == ""  # a verdict (mismatch), not an error


def test_a_fifo_is_refused_as_one_not_called_missing_nor_waited_on(handoff, capsys):
    import os

    directory, c = handoff
    for name in ("model.safetensors", "optimizer.safetensors", "batch_hasher.rank_0.bin", "meta.json"):
        original = (directory / name).read_bytes()
        (directory / name).unlink()
        os.mkfifo(directory / name)
        rc, err = run_cli(capsys, directory, c)  # meta.json opened blocking would wait here for ever
        assert rc == 1 and err.count("\n") == 1 and f"{name}: refused: not a regular file" in err, (name, err)
        (directory / name).unlink()
        (directory / name).write_bytes(original)
    (directory / "model.safetensors").unlink()
    rc, err = run_cli(capsys, directory, c)
    assert rc == 1 and "the hand-off has no model.safetensors" in err


def test_a_state_hash_line_without_its_hash_is_named(handoff, tmp_path, capsys):
    directory, c = handoff
    log = tmp_path / "state_hashes.jsonl"
    lines = (FIXTURES / c["log"]).read_text().splitlines()
    for broken, said in (('{"step": 1}', "no state_hash"), ('{"state_hash": "' + "0" * 64 + '"}', "no step"),
                         ("[1, 2]", "not a JSON object")):
        log.write_text("\n".join([*lines, broken]) + "\n")
        rc = cli.main(["verify-handoff", str(directory), "--state-hashes", str(log)])
        err = capsys.readouterr().err
        assert rc == 1 and err.count("\n") == 1 and f"line {len(lines) + 1}: {said}" in err, err
