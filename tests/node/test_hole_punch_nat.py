"""DCUtR through two home NATs (devnet/nat_topology.py; needs root, iproute2 and iptables): nodes in
homes A and B, each behind a port-preserving MASQUERADE router that drops unsolicited inbound
connections, meet through a relay on the "internet"; the relayed connection becomes direct by a
TCP hole punch from their SO_REUSEPORT listening ports (node/relays.py), and the punch is counted.
With home B behind ``--random-fully`` the punch cannot predict B's port: the connection stays
relayed, and the failed attempts are counted too."""

import os
import shutil
import subprocess

import pytest

from open1b.devnet.nat_topology import HomeSpec, NatTopology

from .relay_node import seeded
from .site_procs import read_line, spawn

PORT = 4801

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("iptables"),
                                reason="needs root, iproute2 and iptables")


def _node(site, seed: int, *args: str) -> subprocess.Popen:
    return spawn(site, "tests.node.relay_node", seed, *args)




def _punch(b_nat: str) -> dict[str, dict]:
    """What homes A and B each report of their connection, once direct or after 40 s."""
    procs: list[subprocess.Popen] = []
    with NatTopology([HomeSpec("a", uplink_mbit=None), HomeSpec("b", nat=b_nat, uplink_mbit=None)]) as net:
        try:
            relay = _node(net.internet, 1, "--listen", f"{net.internet.address}:{PORT}", "--relay")
            procs.append(relay)
            relay_addr = read_line(relay, 60)["addr"]
            a = _node(net.homes["a"], 2, "--listen", f"{net.homes['a'].address}:{PORT}", "--private",
                      "--dial", relay_addr, "--wait-for-peer", seeded(3).peer_id, "--wait", "40")
            procs.append(a)
            read_line(a, 60)
            circuit = read_line(a, 60)["circuit"]
            assert circuit.startswith(f"{relay_addr}/p2p-circuit/p2p/"), circuit
            b = _node(net.homes["b"], 3, "--listen", f"{net.homes['b'].address}:{PORT}", "--dial", relay_addr,
                      "--target", circuit, "--wait", "40")
            procs.append(b)
            read_line(b, 60)
            return {"a": read_line(a, 90), "b": read_line(b, 90)}
        finally:
            for proc in procs:
                proc.kill()
                proc.wait(timeout=10)


@pytest.mark.integration
def test_two_port_preserving_home_nats_are_hole_punched_and_the_punch_is_counted():
    found = _punch("port-preserving")
    assert found["a"]["kind"] == found["b"]["kind"] == "direct", found
    # whichever side's DCUtR drove first initiated it; the other answered
    punches = [side["hole_punches"] for side in found.values()]
    assert sum(p["succeeded"] for p in punches) >= 1 and sum(p["answered"] for p in punches) >= 1, found
    assert all(p["succeeded"] <= p["attempts"] for p in punches), found


@pytest.mark.integration
def test_behind_a_random_port_nat_the_punch_fails_is_counted_and_the_connection_stays_relayed():
    found = _punch("random")
    assert found["a"]["kind"] == found["b"]["kind"] == "relayed", found
    punches = [side["hole_punches"] for side in found.values()]
    assert sum(p["attempts"] for p in punches) >= 1 and sum(p["succeeded"] for p in punches) == 0, found
