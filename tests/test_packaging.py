"""The wheel holds every module: pyproject.toml lists each folder of Python code as a package
(setuptools leaves an unlisted one out of the wheel without an error, while editable installs
and the tests still find it)."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMPORT_NAMES = {"protocol": "open1b.protocol", "deterministic": "open1b.deterministic", "node": "open1b.node",
                "devnet": "open1b.devnet", "sim": "open1b.sim"}


def test_every_folder_of_python_code_is_a_listed_package():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-dir"] == {name: folder for folder, name in IMPORT_NAMES.items()}
    found = set()
    for folder, name in IMPORT_NAMES.items():
        for source in (ROOT / folder).rglob("*.py"):
            parts = source.parent.relative_to(ROOT / folder).parts
            if "__pycache__" not in parts:
                found.add(".".join((name, *parts)))
    assert found == set(setuptools["packages"])


def test_the_corpus_ships_as_package_data():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    corpus = ROOT / "deterministic" / "corpus"
    shipped = {p.name for pattern in data["open1b.deterministic.corpus"] for p in corpus.glob(pattern)}
    assert {"cpython-3.11.7-docstrings.txt", "NOTICE"} <= shipped


def test_every_asset_of_the_web_page_ships_as_package_data():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    static = ROOT / "node" / "web" / "static"
    shipped = {p for pattern in data["open1b.node.web"] for p in (ROOT / "node" / "web").glob(pattern)}
    assert shipped == set(static.iterdir()) and (static / "index.html") in shipped
