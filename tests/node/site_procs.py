"""Test nodes run as child processes inside a NAT topology's sites (devnet/nat_topology.py), each
printing one JSON line per answer: how the NAT tests start them and read them."""

from __future__ import annotations

import json
import select
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def spawn(site, module: str, seed: int, *args: str) -> subprocess.Popen:
    """``python -m module --seed seed args…`` inside ``site``'s network namespace."""
    return subprocess.Popen([*site.prefix, sys.executable, "-m", module, "--seed", str(seed), *args],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def read_line(proc: subprocess.Popen, timeout: float) -> dict:
    """The next JSON line ``proc`` prints, within ``timeout`` s (else it is killed, and its stderr told)."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        proc.kill()
        raise AssertionError(f"no answer in {timeout} s; stderr: {proc.communicate(timeout=10)[1][-3000:]}")
    line = proc.stdout.readline()
    assert line, f"exited: {proc.communicate(timeout=10)[1][-3000:]}"
    return json.loads(line)
