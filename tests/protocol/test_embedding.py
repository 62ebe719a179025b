"""The embedding API as a verifier uses it: examples/verify_coverage.py, here and in a fresh
environment holding only the base install of the distribution (cbor2, pynacl — no node stack)."""

import re
import shutil
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest

from .conftest import ident, make_attestation, make_manifest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "verify_coverage.py"
DATA_EXAMPLE = REPO / "examples" / "verify_data_proof.py"
README_SNIPPET = re.search(r"## Embedding the protocol\n.*?```python\n(.*?)```", (REPO / "README.md").read_text(), re.S).group(1)
HEAVY = ("numba", "numpy", "torch", "libp2p", "trio")


def _run_files(directory: Path, *, disputed: bool, garbage: bool = True) -> tuple[Path, Path]:
    """A 3-step run attested twice per step, plus (optionally) a garbage line and a mismatch."""
    manifest = make_manifest(ident(0), steps=3)
    (directory / "run").mkdir()
    (directory / "run" / "manifest.cbor").write_bytes(manifest.encoded)
    atts = [make_attestation(ident(i), manifest, k) for k in range(3) for i in (1, 2)]
    if disputed:
        atts.append(make_attestation(ident(3), manifest, 1, match=False))
    lines = [a.encoded.hex() for a in atts]
    if garbage:
        lines.insert(2, "not hex at all")
    (directory / "attestations.hex").write_text("".join(line + "\n" for line in lines))
    return directory / "run" / "manifest.cbor", directory / "attestations.hex"


def _example(python: str, directory: Path, *, disputed: bool) -> subprocess.CompletedProcess:
    manifest, atts = _run_files(directory, disputed=disputed)
    return subprocess.run([python, str(EXAMPLE), str(manifest), str(atts), "2"], capture_output=True, text=True,
                          timeout=60)


def _check_example(proc: subprocess.CompletedProcess, *, disputed: bool) -> None:
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("line 3 skipped:")
    if disputed:
        assert lines[2] == "step 1: disputed, 2 match, 1 mismatch"
        assert lines[-1] == "2/3 verified, disputed [1], complete True" and proc.returncode == 2
    else:
        assert lines[1:4] == [f"step {k}: verified, 2 match, 0 mismatch" for k in range(3)]
        assert lines[-1] == "3/3 verified, disputed [], complete True" and proc.returncode == 0


def _data_answers(directory: Path) -> list[tuple[Path, Path, str]]:
    """Answers of the data command for a shipped-corpus run (built here, with the engine): a drawn
    document, an undrawn one, one not in the corpus, and a forged exclusion (the drawn document
    claimed never drawn). Each is (document file, answer file, the line the example must print)."""
    import json

    from open1b.deterministic.document_proofs import _documents, prove_document
    from open1b.deterministic.data import builtin_split, step_sample_indices
    from open1b.deterministic import PRESETS
    from open1b.protocol.data_proofs import proof_to_json
    from open1b.protocol.documents import NeverDrawnProof
    from tests.runs import corpus_run

    run = directory / "run"
    run.mkdir()
    _, manifest = corpus_run(run, steps=2)
    docs, _, _ = _documents(0)
    stream = builtin_split(0).train
    drawn_sample = int(step_sample_indices(manifest.seed, 1, PRESETS["tiny"].topology, manifest.samples)[1, 0, 1])
    drawn = next(i for i, (s, e, _) in enumerate(docs.entries) if s <= drawn_sample * 32 < e)
    never = next(i for i in range(len(docs.entries)) if prove_document(
        run, stream[docs.entries[i][0]:docs.entries[i][1]], manifest).answer == "never_drawn")
    texts = {"included": stream[docs.entries[drawn][0]:docs.entries[drawn][1]],
             "never_drawn": stream[docs.entries[never][0]:docs.entries[never][1]],
             "absent": b"== not.in.the.corpus ==\nA docstring nobody wrote.\n\n"}
    out = []
    for name, text in texts.items():
        answer = prove_document(run, text, manifest)
        assert answer.answer == name
        (directory / f"{name}.txt").write_bytes(text)
        (directory / f"{name}.json").write_text(json.dumps(answer.to_json()))
        out.append((directory / f"{name}.txt", directory / f"{name}.json", f"{name}: holds"))
    included = json.loads((directory / "included.json").read_text())
    forged = {**included, "proof": proof_to_json(NeverDrawnProof(prove_document(run, texts["included"]).proof.entry))}
    (directory / "forged.json").write_text(json.dumps(forged))
    out.append((directory / "included.txt", directory / "forged.json", "never_drawn: fails: drawn"))
    return out


def _check_data_example(python: str, directory: Path) -> None:
    for document, answer, line in _data_answers(directory):
        proc = subprocess.run([python, str(DATA_EXAMPLE), str(directory / "run" / "manifest.cbor"), str(document),
                               str(answer)], capture_output=True, text=True, timeout=120)
        assert proc.stdout.strip() == line, proc.stdout + proc.stderr
        assert proc.returncode == (2 if "fails" in line else 0)


def test_data_example_verifies_every_kind_of_proof(tmp_path):
    _check_data_example(sys.executable, tmp_path)


@pytest.mark.parametrize("disputed", [False, True])
def test_example_verifies_coverage(tmp_path, disputed):
    _check_example(_example(sys.executable, tmp_path, disputed=disputed), disputed=disputed)


def test_example_is_a_dozen_lines():
    code = [line for line in EXAMPLE.read_text().split('"""', 2)[2].splitlines()
            if line.strip() and not line.startswith(("import", "from"))]
    assert len(code) <= 12


def test_base_install_runs_the_example_without_the_node_stack(tmp_path):
    """`pip install <repo>` without extras, in a fresh virtual environment (PyPI reachable)."""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    # setuptools maps every package folder (protocol, deterministic, node, devnet, sim); only protocol imports
    folders = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values())
    for package in sorted(folders):
        shutil.copytree(REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    venv.EnvBuilder(with_pip=True).create(tmp_path / "venv")
    python = str(tmp_path / "venv" / "bin" / "python")
    install = subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", str(source)],
                             capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stdout + install.stderr
    probe = subprocess.run([python, "-c", (
        "import importlib.util, importlib.metadata as md, open1b.protocol\n"
        f"print(sorted(m for m in {HEAVY!r} if importlib.util.find_spec(m)))\n"
        "print(sorted(d.metadata['Name'].lower() for d in md.distributions()))\n")],
        capture_output=True, text=True, check=True, cwd=tmp_path)
    heavy, dists = probe.stdout.splitlines()
    assert heavy == "[]"
    assert set(eval(dists)) <= {"open1b", "cbor2", "pynacl", "cffi", "pycparser", "pip", "setuptools"}
    for disputed in (False, True):
        work = tmp_path / f"case-{disputed}"
        work.mkdir()
        _check_example(_example(python, work, disputed=disputed), disputed=disputed)
    _run_files(tmp_path, disputed=True, garbage=False)
    readme = subprocess.run([python, "-c", README_SNIPPET], cwd=tmp_path, capture_output=True, text=True)
    assert readme.stdout.strip() == "2 verified; disputed: [1] ; complete: True", readme.stderr
    # data proofs (docs/run-format.md §8): in the corpus and used, in the corpus and never drawn,
    # not in the corpus, and a forged exclusion, each checked by the base install alone
    (tmp_path / "data").mkdir()
    _check_data_example(python, tmp_path / "data")
