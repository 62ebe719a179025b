"""examples/verify_fraud_proof.py judges proofs in an interpreter that can import only open1b's
protocol package, cbor2, pynacl (with cffi), numpy and blake3 (the referee extra): no site-packages, a path holding just those
(linked from this environment). If the example, or anything it imports, needed numba, torch, trio
or libp2p, it would fail to import here."""

import json
import subprocess
import sys
from pathlib import Path

import blake3
import cbor2
import cffi
import nacl
import numpy
import pytest

from tests.vectors import ROOT as VECTORS

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "verify_fraud_proof.py"
HEAVY = ("numba", "torch", "trio", "libp2p", "llvmlite", "open1b.deterministic", "open1b.node")


@pytest.fixture(scope="module")
def referee_only_path(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("referee-only")
    (root / "open1b").mkdir()
    (root / "open1b" / "protocol").symlink_to(REPO / "protocol")
    site = Path(numpy.__file__).resolve().parents[1]
    for module in (cbor2, nacl, cffi, numpy, blake3):
        (root / module.__name__).symlink_to(Path(module.__file__).resolve().parent)
    for extra in [*site.glob("_cffi_backend*.so"), *site.glob("numpy.libs"), *site.glob("_cbor2*.so")]:
        (root / extra.name).symlink_to(extra)
    return root


def _run(path: Path, proof: Path, *args: str) -> subprocess.CompletedProcess:
    probe = f"import runpy, sys; sys.argv = {[str(EXAMPLE), str(proof), *args]!r}\n" \
            "try:\n    runpy.run_path(sys.argv[0], run_name='__main__')\n" \
            f"finally:\n    print(sorted(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)\n"
    return subprocess.run([sys.executable, "-I", "-S", "-c", f"import sys; sys.path.insert(0, {str(path)!r})\n" + probe],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("case,status", [("matmul-true", 0), ("matmul-forged", 2), ("unsupported-op", 3),
                                         ("cross_entropy-true", 0), ("matmul-sliced-true", 0),
                                         ("sliced-wrong-cv", 2)])
def test_the_example_judges_vectors_with_only_the_base_install_and_numpy(referee_only_path, tmp_path, case, status):
    vector = json.loads((VECTORS / "dispute" / f"{case}.json").read_text())
    proof = tmp_path / "proof.cbor"
    proof.write_bytes(bytes.fromhex(vector["proof"][2:]))
    proc = _run(referee_only_path, proof)
    assert proc.returncode == status, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "[]"  # nothing heavy was imported
    if status == 0:
        assert proc.stdout.strip() == f"step 3, op {vector['position']} ({vector['op']}): guilty {vector['guilty'][0]}"
    else:
        assert proc.stdout.startswith(f"{vector['outcome']}: {vector['code']} ")
    as_json = json.loads(_run(referee_only_path, proof, "--json").stdout)
    assert (as_json["outcome"], as_json["code"], as_json["guilty"]) == (vector["outcome"], vector["code"],
                                                                       vector["guilty"])


def test_the_isolated_interpreter_cannot_import_the_node_stack(referee_only_path):
    """The check above means something: in that interpreter the heavy packages are not importable."""
    code = f"import sys; sys.path.insert(0, {str(referee_only_path)!r})\nimport importlib.util\n" \
           f"print(sorted(m for m in ('numba', 'torch', 'trio', 'libp2p', 'numpy') if importlib.util.find_spec(m)))"
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['numpy']"
