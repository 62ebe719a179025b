"""Mutation test of the ``dispute`` vectors: ``referee_reading.py`` (§18 read from the text) passes
every case, and each wrong reading of ``referee_mutants.py`` fails at least one."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

from . import referee_reading
from .conftest import SUMMARY
from .referee_mutants import MUTANTS

CASES = [(p.stem, json.loads(p.read_text()))
         for p in sorted((Path(__file__).resolve().parents[1] / "vectors" / "dispute").glob("*.json"))]


def _killer(module: ModuleType) -> str | None:
    for name, case in CASES:
        try:
            got = module.judge(bytes.fromhex(case["proof"][2:]))
        except Exception:  # a wrong reading may crash: that fails the case too
            return name
        if got != (case["outcome"], case["code"], case["guilty"]):
            return name
    return None


def test_the_reading_passes_every_dispute_vector():
    assert len(CASES) > 30 and _killer(referee_reading) is None


def test_every_referee_mutant_is_killed_by_a_vector():
    assert len({m.name for m in MUTANTS}) == len(MUTANTS) >= 15
    survivors = [f"{m.name} ({m.section}: {m.reading})" for m in MUTANTS if _killer(m.of(referee_reading)) is None]
    SUMMARY.append(f"referee mutation test: {len(MUTANTS)} mutants, {len(MUTANTS) - len(survivors)} killed")
    assert not survivors, "mutants no vector rejects:\n" + "\n".join(survivors)
