"""Mutation test of the vectors: a reading of the spec that the vectors do not reject is a rule
the spec states and the vectors do not pin (issue 17).

``reference.py`` is the spec read correctly and must pass every vector; each mutant of
``mutants.py`` is a wrong reading of one rule and must fail at least one. The test prints how
many mutants there are and how many the vectors kill.
"""

from __future__ import annotations

from types import ModuleType

from . import reference, runner
from .conftest import SUMMARY
from .mutants import MUTANTS

CASES = [(suite, name, case) for suite in runner.SUITES for name, case in runner.cases(suite)]


def killer(module: ModuleType) -> str | None:
    """The first vector case the module gets wrong, or None."""
    for suite, name, case in CASES:
        if runner.failure(module, suite, case) is not None:
            return f"{suite}/{name}"
    return None


def test_the_reference_passes_every_vector():
    failures = [(f"{s}/{n}", why) for s, n, c in CASES if (why := runner.failure(reference, s, c)) is not None]
    assert not failures
    assert {s for s, _, _ in CASES} == set(runner.SUITES) and len(CASES) > 200


def test_mutants_are_distinct_and_cover_every_section():
    assert len({m.name for m in MUTANTS}) == len(MUTANTS)
    sections = {m.section.split()[0] for m in MUTANTS}
    assert {"§3.1", "§3.2", "§5.2", "§5.4", "§6.3", "§7", "§8.3", "§8.5", "§8.6", "§8.7", "§10"} <= sections
    assert sum("run format" in m.section for m in MUTANTS) >= 3  # the manifest's run-format checks
    assert sum(m.section.startswith("run format §8") for m in MUTANTS) >= 5  # the data proofs
    assert len(MUTANTS) >= 40


def test_every_mutant_is_killed_by_a_vector():
    survivors, kills = [], {}
    for mutant in MUTANTS:
        kills[mutant.name] = killer(mutant.of(reference))
        if kills[mutant.name] is None:
            survivors.append(f"{mutant.name} ({mutant.section}: {mutant.reading})")
    killed = len(MUTANTS) - len(survivors)
    SUMMARY.append(f"mutation test: {len(MUTANTS)} mutants, {killed} killed, kill rate {killed / len(MUTANTS):.0%}"
                   f" ({len(CASES)} vector cases)")
    assert not survivors, "mutants no vector rejects:\n" + "\n".join(survivors)
