"""Driving real daemons from tests: the ``open1b-node`` CLI as a subprocess, and polling."""

import subprocess
import sys
import time

CLI = [sys.executable, "-m", "open1b.node.cli"]


def cli(*args, timeout=120):
    """Run ``open1b-node ARGS``; returns (exit code, stdout, stderr)."""
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


def wait_for(predicate, timeout, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)
