"""How ``cpython-3.11.7-docstrings.txt`` was made (run once; the output is committed).

The corpus is the docstrings of the pure-Python standard library of CPython 3.11.7, which is
distributed under the PSF License Agreement (see ``LICENSE-PSF.txt`` and ``NOTICE`` here).
The rule, so that anyone can check the committed file byte for byte:

1. Walk ``Lib/`` of CPython 3.11.7 (``sysconfig.get_paths()["stdlib"]``) top-down as
   :func:`os.walk` does (a directory's files before its subdirectories), names in code-point
   order, skipping the directories in :data:`EXCLUDED_DIRS` (tests, IDLE, tkinter, turtledemo,
   lib2to3, ensurepip, site-packages, caches); take every ``*.py``.
2. Parse each file with :func:`ast.parse` (never import it: importing runs code) and visit the
   module, then its classes and functions recursively in source order. Each docstring is taken
   with ``ast.get_docstring(node, clean=True)`` (``inspect.cleandoc``: tabs expanded, common
   indentation removed, leading and trailing blank lines dropped).
3. A docstring identical to one already taken is skipped (the stdlib repeats a few).
4. Each docstring becomes one document ``"== " + name + " ==\\n" + docstring + "\\n\\n"`` where
   ``name`` is the dotted module path plus the qualified name (``json.JSONDecoder.decode``).
5. Documents are appended in that order while the total stays within :data:`MAX_BYTES` of
   UTF-8; the first document that would exceed it ends the corpus.

Run ``python deterministic/corpus/build.py --check`` to rebuild in memory and compare with
the committed file. Only CPython 3.11.7 reproduces it (other versions have other docstrings);
the engine never runs this script, it reads the committed file.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import os
import sys
import sysconfig
from pathlib import Path

PYTHON_VERSION = (3, 11, 7)
MAX_BYTES = 1_000_000
EXCLUDED_DIRS = frozenset(
    {"__pycache__", "ensurepip", "idlelib", "lib2to3", "site-packages", "test", "tests", "tkinter", "turtledemo"}
)
OUTPUT = Path(__file__).with_name("cpython-3.11.7-docstrings.txt")


def _documents(module: str, tree: ast.Module):
    def visit(node, prefix: str):
        for child in node.body:
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}.{child.name}"
                doc = ast.get_docstring(child, clean=True)
                if doc:
                    yield name, doc
                yield from visit(child, name)

    doc = ast.get_docstring(tree, clean=True)
    if doc:
        yield module, doc
    yield from visit(tree, module)


def _sources(lib: Path):
    for root, dirs, files in os.walk(lib):
        dirs[:] = sorted(d for d in dirs if d not in EXCLUDED_DIRS)
        for name in sorted(files):
            if name.endswith(".py"):
                yield Path(root) / name


def _module_name(lib: Path, path: Path) -> str:
    parts = list(path.relative_to(lib).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def build(lib: Path) -> bytes:
    out, seen, total = [], set(), 0
    for path in _sources(lib):
        tree = ast.parse(path.read_bytes(), filename=str(path))
        for name, doc in _documents(_module_name(lib, path), tree):
            if doc in seen:
                continue
            seen.add(doc)
            chunk = f"== {name} ==\n{doc}\n\n".encode("utf-8")
            if total + len(chunk) > MAX_BYTES:
                return b"".join(out)
            out.append(chunk)
            total += len(chunk)
    return b"".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="compare with the committed file instead of writing it")
    args = p.parse_args()
    if sys.version_info[:3] != PYTHON_VERSION:
        print(f"needs CPython {'.'.join(map(str, PYTHON_VERSION))}, this is {sys.version.split()[0]}", file=sys.stderr)
        return 1
    data = build(Path(sysconfig.get_paths()["stdlib"]))
    digest = hashlib.blake2b(data, digest_size=32).hexdigest()
    if args.check:
        same = OUTPUT.read_bytes() == data
        print(f"{'identical' if same else 'DIFFERENT'}: {len(data)} bytes, blake2b-256 {digest}")
        return 0 if same else 1
    OUTPUT.write_bytes(data)
    print(f"wrote {OUTPUT.name}: {len(data)} bytes, blake2b-256 {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
