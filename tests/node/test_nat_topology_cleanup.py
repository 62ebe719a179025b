"""The NAT topology's housekeeping (devnet/nat_topology.py): a killed run's leftovers are cleared,
and two topologies on one host take turns. Apart from tests/node/test_nat_topology.py, whose
topology lives as long as its module: a second topology in the same process would wait for that
one's lock forever."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys

import pytest

from open1b.devnet.nat_topology import LOCK_PATH, TAG_PREFIX, HomeSpec, NatTopology, clear_stale

_missing = [tool for tool in ("ip", "tc", "iptables") if shutil.which(tool) is None]
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0 or bool(_missing),
                       reason="the NAT topology needs root, iproute2 and iptables (./dev installs them as root)"
                              + (f"; missing: {', '.join(_missing)}" if _missing else "; not root")),
]



def test_a_killed_runs_namespaces_and_host_links_are_cleared_by_the_next_topology():
    """What a run killed mid-topology leaves (its namespaces and its host-side management link,
    holding an address every topology uses) is deleted before the next one is built; a live
    run's are kept."""
    live = {int(p) % 100000 for p in os.listdir("/proc") if p.isdigit()}
    dead = next(n for n in range(99999, 0, -1) if n not in live)
    ns, inner, outer = f"{TAG_PREFIX}{dead}h1", f"{TAG_PREFIX}{dead}mn1", f"{TAG_PREFIX}{dead}mh1"
    with open(LOCK_PATH, "a") as lock:  # not while another topology uses the address
        fcntl.flock(lock, fcntl.LOCK_EX)
        subprocess.run(["ip", "netns", "add", ns], check=True)
        subprocess.run(["ip", "link", "add", inner, "type", "veth", "peer", "name", outer], check=True)
        subprocess.run(["ip", "link", "set", inner, "netns", ns], check=True)
        subprocess.run(["ip", "addr", "add", "10.242.1.254/24", "dev", outer], check=True)
    try:
        with NatTopology([HomeSpec("a")]) as topology:
            assert ns not in _names("ip", "netns", "list") and outer not in _names("ip", "-br", "link")
            route = subprocess.run(["ip", "-o", "route", "get", topology.homes["a"].api_address],
                                   capture_output=True, text=True)
            assert f"dev {topology.tag}mh1 " in route.stdout, route.stdout + route.stderr
            assert topology.homes["a"].namespace not in clear_stale()
        assert not any(name.startswith(topology.tag) for name in _names("ip", "netns", "list"))
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", outer], capture_output=True)


def test_topologies_on_one_host_take_turns():
    """Every topology uses the same management addresses on this host, so a second (another
    devnet, another test worker) waits for the first to be torn down."""
    try_lock = f"import fcntl; fcntl.flock(open({LOCK_PATH!r}, 'a'), fcntl.LOCK_EX | fcntl.LOCK_NB)"
    with NatTopology([HomeSpec("a")]):
        held = subprocess.run([sys.executable, "-c", try_lock], capture_output=True, text=True)
        assert held.returncode != 0 and "BlockingIOError" in held.stderr


def _names(*cmd: str) -> set[str]:
    out = subprocess.run(list(cmd), capture_output=True, text=True, check=True).stdout
    return {line.split()[0].split("@")[0] for line in out.splitlines() if line.strip()}
