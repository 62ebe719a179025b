"""The README's embedding example must run as printed, against real files."""

import re
import subprocess
import sys
from pathlib import Path

from .conftest import ident, make_attestation, make_manifest

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_embedding_example_runs(tmp_path):
    block = re.search(r"## Embedding the protocol\n.*?```python\n(.*?)```", README.read_text(), re.S).group(1)
    manifest = make_manifest(ident(0), steps=3)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "manifest.cbor").write_bytes(manifest.encoded)
    atts = [make_attestation(ident(i), manifest, k) for k in range(3) for i in (1, 2)]
    atts.append(make_attestation(ident(3), manifest, 1, match=False))
    (tmp_path / "attestations.hex").write_text("".join(a.encoded.hex() + "\n" for a in atts))
    out = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "2 verified; disputed: [1] ; complete: True"
