"""``open1b-devnet --help``: the scenario list is the registry's (devnet/cli.py), so it cannot drift."""

from __future__ import annotations

import re

from open1b.devnet.cli import parser
from open1b.devnet.scenarios import TYPES


def test_help_lists_every_registered_scenario(monkeypatch):
    # argparse wraps help at the terminal's width (COLUMNS) and breaks lines at hyphens, inside a
    # name too ("refusing-" / "trainer"): so wide that it wraps nothing, each name is one word
    monkeypatch.setenv("COLUMNS", "10000")
    [scenario_help] = [line for line in parser().format_help().splitlines() if line.lstrip().startswith("--scenario")]
    listed = re.findall(r"[a-z]+(?:-[a-z]+)*", scenario_help.split("(repeatable):")[1])
    assert set(TYPES) <= set(listed)
