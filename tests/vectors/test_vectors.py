"""The vectors on disk, the code that generates them and the code that checks them must agree.

A change to the protocol's output fails the first test until the vectors are regenerated
(``python -m tests.vectors``) and the diff reviewed; each case file is then checked on its own,
from its inputs alone, as another implementation would check it.
"""

import json

import pytest

from . import ROOT, SUITES, generated


@pytest.mark.parametrize("name", sorted(SUITES))
def test_files_on_disk_are_what_the_code_generates(name):
    want = generated(SUITES[name])
    directory = ROOT / name
    have = {str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()}
    assert sorted(have) == sorted(want), "stale or missing vector files: run `python -m tests.vectors`"
    for path, data in want.items():
        assert have[path] == data, f"{name}/{path} differs from what the code generates"


CASES = [(name, path) for name in sorted(SUITES) for path in sorted((ROOT / name).glob("*.json"))]


@pytest.mark.parametrize("name,path", CASES, ids=[f"{n}/{p.stem}" for n, p in CASES])
def test_each_case_checks(name, path):
    SUITES[name].check(json.loads(path.read_text()), ROOT / name)


def test_every_suite_has_cases():
    assert {name for name, _ in CASES} == set(SUITES)
