"""DHT client mode behind a real NAT (devnet/nat_topology.py; needs root, iproute2 and iptables): a
node at home, whose peers on the internet cannot dial it back, runs the DHT in client mode —
it keeps the internet's server peers in its routing table, answers no DHT request, and the
internet nodes drop it from theirs — and its claim, written and re-read through the DHT, is what
an internet node then reads from the network."""

import json
import os
import select
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from open1b.devnet.nat_topology import HomeSpec, NatTopology

from .dht_client_node import seeded

ROOT = Path(__file__).resolve().parents[2]
PORT = 4811

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("iptables"),
                                reason="needs root, iproute2 and iptables")


def _node(site, seed: int, port: int, *args: str) -> subprocess.Popen:
    return subprocess.Popen([*site.prefix, sys.executable, "-m", "tests.node.dht_client_node", "--seed", str(seed),
                             "--listen", f"{site.address}:{port}", *args],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _line(proc: subprocess.Popen, timeout: float) -> dict:
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        proc.kill()
        raise AssertionError(f"no answer in {timeout} s; stderr: {proc.communicate(timeout=10)[1][-3000:]}")
    line = proc.stdout.readline()
    assert line, f"exited: {proc.communicate(timeout=10)[1][-3000:]}"
    return json.loads(line)


@pytest.mark.integration
def test_a_home_node_runs_the_dht_as_a_client_and_its_claim_reaches_the_internet():
    procs: list[subprocess.Popen] = []
    home_id = seeded(3).peer_id
    with NatTopology([HomeSpec("a", uplink_mbit=None)]) as net:
        try:
            first = _node(net.internet, 1, PORT, "--home", home_id)
            procs.append(first)
            first_addr = _line(first, 60)["addr"]
            second = _node(net.internet, 2, PORT + 1, "--dial", first_addr, "--home", home_id)
            procs.append(second)
            second_addr = _line(second, 60)["addr"]
            home = _node(net.homes["a"], 3, PORT, "--dial", first_addr, "--dial", second_addr)
            procs.append(home)
            _line(home, 60)
            mode = _line(home, 90)
            assert mode["reachability"] == "private" and mode["dht_mode"] == "client", mode
            # py-libp2p's switch to client mode empties the routing table: the servers were added back
            assert mode["routing_table"] == sorted([seeded(1).peer_id, seeded(2).peer_id]), mode
            assert _line(home, 90) == {"claimed": True}
            for internet in (first, second):
                seen = _line(internet, 150)
                assert seen == {"claimant": home_id, "home_in_routing_table": False, "kad_stream_opens": False}, seen
        finally:
            for proc in procs:
                proc.kill()
                proc.wait(timeout=10)
