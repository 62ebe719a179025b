"""Reachability behind a real NAT (network namespaces and iptables; needs root): a home node behind
a MASQUERADE router is told `private`, the two nodes on the "internet" side `public`.

    internet (ns I): B, C on 11.77.0.1 ── 11.77.0.2 router (ns R, MASQUERADE) 10.78.0.1 ── 10.78.0.2 (ns H): A

Nothing leaves the namespaces: the "internet" addresses are global only so that the verdict's
global-address rule applies, as it would on the real internet.
"""

import json
import os
import select
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TAG = f"o1r{os.getpid() % 100000}"
NS = {"inet": f"{TAG}i", "router": f"{TAG}r", "home": f"{TAG}h"}

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("iptables"),
                                reason="needs root, iproute2 and iptables")


def _run(*cmd: str) -> None:
    proc = subprocess.run(list(cmd), capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {proc.stderr.strip()}")


def _topology() -> None:
    i, r, h = NS["inet"], NS["router"], NS["home"]
    for ns in (i, r, h):
        _run("ip", "netns", "add", ns)
        _run("ip", "-n", ns, "link", "set", "lo", "up")
    for (a, a_addr), (b, b_addr), name in (((i, "11.77.0.1/24"), (r, "11.77.0.2/24"), "ir"),
                                           ((h, "10.78.0.2/24"), (r, "10.78.0.1/24"), "hr")):
        dev_a, dev_b = f"{TAG}{name}", f"{TAG}{name[::-1]}"
        _run("ip", "link", "add", dev_a, "type", "veth", "peer", "name", dev_b)
        for ns, dev, addr in ((a, dev_a, a_addr), (b, dev_b, b_addr)):
            _run("ip", "link", "set", dev, "netns", ns)
            _run("ip", "-n", ns, "addr", "add", addr, "dev", dev)
            _run("ip", "-n", ns, "link", "set", dev, "up")
    _run("ip", "-n", h, "route", "add", "default", "via", "10.78.0.1")
    _run("ip", "netns", "exec", r, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
    _run("ip", "netns", "exec", r, "iptables", "-t", "nat", "-A", "POSTROUTING", "-o", f"{TAG}ri", "-j", "MASQUERADE")


def _teardown() -> None:
    for ns in NS.values():  # deleting a namespace deletes its links
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _node(ns: str, seed: int, listen: str, peers: int, dial: list[str] = ()) -> subprocess.Popen:
    cmd = ["ip", "netns", "exec", NS[ns], sys.executable, "-m", "tests.node.reachability_node", "--seed", str(seed),
           "--listen", listen, "--peers", str(peers)] + [a for addr in dial for a in ("--dial", addr)]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _line(proc: subprocess.Popen, timeout: float) -> dict:
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"no answer in {timeout} s; stderr: {_stderr(proc)}"
    line = proc.stdout.readline()
    assert line, f"exited: {_stderr(proc)}"
    return json.loads(line)


def _stderr(proc: subprocess.Popen) -> str:
    proc.kill()
    return proc.communicate(timeout=10)[1][-2000:]


def test_a_node_behind_nat_is_private_and_internet_nodes_are_public():
    procs: list[subprocess.Popen] = []
    try:
        try:
            _topology()
        except RuntimeError as exc:
            pytest.skip(f"cannot build the NAT topology here: {exc}")
        b = _node("inet", 1, "11.77.0.1", peers=2)
        procs.append(b)
        b_addr = _line(b, 60)["addr"]
        c = _node("inet", 2, "11.77.0.1", peers=2, dial=[b_addr])
        procs.append(c)
        c_addr = _line(c, 60)["addr"]
        a = _node("home", 3, "10.78.0.2", peers=2, dial=[b_addr, c_addr])
        procs.append(a)
        _line(a, 60)
        home, internet = _line(a, 90), [_line(p, 90) for p in (b, c)]
        assert home["state"] == "private", home
        # the peers dialled the router's address (where the home node's connections come from), and no one answered
        assert "could not dial back to 11.77.0.2" in home["reason"] and "behind NAT" in home["reason"], home
        for verdict in internet:
            assert verdict == {"state": "public", "reason": "2 peers dialled back to 11.77.0.1"}, verdict
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)
        _teardown()
