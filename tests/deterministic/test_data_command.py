"""``open1b-node data RUN (--include | --exclude) (FILE | --text T)`` (docs/run-format.md §8.6):
the answer's proof verifies with the protocol alone, and the exit status says whether the answer
is the one asked for."""

import json

import pytest

from open1b.deterministic.data import builtin_split
from open1b.deterministic.documents import Documents
from open1b.node.cli import main
from open1b.protocol import DataCommitments, proof_from_json, verify_data_proof
from open1b.protocol.data_order import draws_between
from tests.runs import corpus_run


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("data-run")
    _, manifest = corpus_run(run_dir, steps=2)
    stream = builtin_split(0).train
    entries = Documents.of(stream).entries
    drawn = {d.index * 32 for d in draws_between(manifest.seed, range(2), 2, 2, 2, manifest.samples, 0, manifest.samples)}
    used = next(i for i, (s, e, _) in enumerate(entries) if any(s <= t < e for t in drawn))
    unused = next(i for i, (s, e, _) in enumerate(entries) if not any(s - 32 <= t < e for t in drawn))
    texts = {"included": stream[entries[used][0]:entries[used][1]],
             "never_drawn": stream[entries[unused][0]:entries[unused][1]], "absent": b"Return the answer.\n"}
    return run_dir, manifest, texts


def ask(capsys, *argv) -> tuple[int, dict]:
    code = main(["data", *map(str, argv), "--json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("kind", ["included", "never_drawn", "absent"])
def test_each_answer_verifies_and_sets_the_exit_status(run, tmp_path, capsys, kind):
    run_dir, manifest, texts = run
    document = tmp_path / "doc.txt"
    document.write_bytes(texts[kind])
    code_in, answer = ask(capsys, run_dir, "--include", document)
    code_out, same = ask(capsys, run_dir, "--exclude", document)
    assert answer == same and answer["answer"] == kind and answer["verified"] is True
    assert (code_in, code_out) == ((0, 3) if kind == "included" else (3, 0))
    check = verify_data_proof(DataCommitments.from_manifest(manifest), texts[kind], proof_from_json(answer["proof"]))
    assert check.holds


def test_text_is_its_utf8_bytes_and_a_near_duplicate_is_another_document(run, capsys):
    run_dir, _, texts = run
    text = texts["included"].decode("utf-8")
    assert ask(capsys, run_dir, "--include", "--text", text)[1]["answer"] == "included"
    assert ask(capsys, run_dir, "--include", "--text", text.rstrip("\n") + "\n")[1]["answer"] == "absent"
    assert main(["data", str(run_dir), "--exclude"]) == 1  # neither a file nor a text


def test_the_text_rendering_names_every_row(run, capsys):
    run_dir, _, texts = run
    assert main(["data", str(run_dir), "--include", "--text", texts["included"].decode()]) == 0
    out = capsys.readouterr().out
    assert "USED (document" in out and "STEP      RANK  MICRO  ROW  SAMPLE" in out


def test_a_link_is_not_followed(run, tmp_path, capsys):
    run_dir, _, texts = run
    (tmp_path / "real.txt").write_bytes(texts["absent"])
    (tmp_path / "link.txt").symlink_to(tmp_path / "real.txt")
    assert main(["data", str(run_dir), "--exclude", str(tmp_path / "link.txt")]) == 1
    assert "cannot read" in capsys.readouterr().err
