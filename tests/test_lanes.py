"""The unit lane's guard (tests/conftest.py) recognises daemon command lines and only those."""

import subprocess
import sys

import pytest

from tests.conftest import _starts_a_daemon


def test_daemon_command_lines_are_recognised():
    assert _starts_a_daemon([sys.executable, "-m", "open1b.node.cli", "daemon", "--data-dir", "x"])
    assert _starts_a_daemon(["/venv/bin/open1b-node", "daemon"])
    assert _starts_a_daemon([sys.executable, "-m", "open1b.devnet.daemon_entry", "--data-dir", "x"])


def test_other_command_lines_are_not():
    assert not _starts_a_daemon([sys.executable, "-m", "open1b.node.cli", "status"])
    assert not _starts_a_daemon(["mount", "-t", "tmpfs", "daemon"])
    assert not _starts_a_daemon("open1b-node daemon")


def test_an_unmarked_test_cannot_start_a_daemon():
    with pytest.raises(AssertionError, match="not marked integration"):
        subprocess.Popen([sys.executable, "-m", "open1b.node.cli", "daemon", "--help"])
