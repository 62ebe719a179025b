"""The embedding API as a verifier uses it: examples/verify_coverage.py, here and in a fresh
environment holding only the base install of the distribution (cbor2, pynacl — no node stack)."""

import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from .conftest import ident, make_attestation, make_manifest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "verify_coverage.py"
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
    for package in ("protocol", "deterministic", "node"):  # setuptools maps all three; only protocol imports
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
