"""DHT client mode behind a real NAT (devnet/nat_topology.py; needs root, iproute2 and iptables): a
node at home, whose peers on the internet cannot dial it back, runs the DHT in client mode —
it keeps the internet's server peers in its routing table, answers no DHT request, and the
internet nodes drop it from theirs — and its claim, written and re-read through the DHT, is what
an internet node then reads from the network."""

import os
import shutil
import subprocess

import pytest

from open1b.devnet.nat_topology import HomeSpec, NatTopology

from .dht_client_node import seeded
from .site_procs import read_line, spawn

PORT = 4811

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("iptables"),
                                reason="needs root, iproute2 and iptables")


def _node(site, seed: int, port: int, *args: str) -> subprocess.Popen:
    return spawn(site, "tests.node.dht_client_node", seed, "--listen", f"{site.address}:{port}", *args)




@pytest.mark.integration
def test_a_home_node_runs_the_dht_as_a_client_and_its_claim_reaches_the_internet():
    procs: list[subprocess.Popen] = []
    home_id = seeded(3).peer_id
    with NatTopology([HomeSpec("a", uplink_mbit=None)]) as net:
        try:
            first = _node(net.internet, 1, PORT, "--home", home_id)
            procs.append(first)
            first_addr = read_line(first, 60)["addr"]
            second = _node(net.internet, 2, PORT + 1, "--dial", first_addr, "--home", home_id)
            procs.append(second)
            second_addr = read_line(second, 60)["addr"]
            home = _node(net.homes["a"], 3, PORT, "--dial", first_addr, "--dial", second_addr)
            procs.append(home)
            read_line(home, 60)
            mode = read_line(home, 90)
            assert mode["reachability"] == "private" and mode["dht_mode"] == "client", mode
            # py-libp2p's switch to client mode empties the routing table: the servers were added back
            assert mode["routing_table"] == sorted([seeded(1).peer_id, seeded(2).peer_id]), mode
            assert read_line(home, 90) == {"claimed": True}
            for internet in (first, second):
                seen = read_line(internet, 150)
                assert seen == {"claimant": home_id, "home_in_routing_table": False, "kad_stream_opens": False}, seen
        finally:
            for proc in procs:
                proc.kill()
                proc.wait(timeout=10)
