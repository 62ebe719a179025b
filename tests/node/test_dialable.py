"""Which peer addresses a node dials (node/dialable.py)."""

import ipaddress

from multiaddr import Multiaddr

from open1b.node.dialable import dialable, dialable_only, interfaces, is_circuit, local_networks

HOME = (ipaddress.IPv4Network("192.168.1.0/24"), ipaddress.IPv4Network("127.0.0.0/8"))
RELAY = "/ip4/11.240.0.1/tcp/4701/p2p/12D3KooWJWoaqZhDaoEFshF7Rh1bpY9ohihFhzcW6d69Lr2NASuq"


def test_global_loopback_and_own_lan_are_dialable_other_private_ranges_are_not():
    assert dialable("/ip4/11.240.0.1/tcp/4701", HOME)
    assert dialable("/ip4/127.0.0.1/tcp/4701", HOME)
    assert dialable("/ip4/192.168.1.7/tcp/4701", HOME)  # the same LAN
    for other in ("192.168.2.2", "10.0.0.1", "172.16.0.1", "100.64.0.1", "169.254.1.1", "0.0.0.0"):
        assert not dialable(f"/ip4/{other}/tcp/4701", HOME), other
    # a circuit address is judged by its relay's host, the one a dial goes to
    assert dialable(f"{RELAY}/p2p-circuit", HOME) and is_circuit(f"{RELAY}/p2p-circuit")
    assert not is_circuit(RELAY)
    # what is not IPv4 is not judged here
    assert dialable("/ip6/::1/tcp/4701", HOME)
    kept = dialable_only([Multiaddr("/ip4/192.168.2.2/tcp/1"), Multiaddr("/ip4/11.240.0.1/tcp/1")], HOME)
    assert kept == [Multiaddr("/ip4/11.240.0.1/tcp/1")]


def test_this_machines_networks_hold_its_interface_addresses():
    found = interfaces()
    assert any(i.ip.is_loopback for i in found)
    assert {i.network for i in found} == set(local_networks())
    assert all(dialable(f"/ip4/{i.ip}/tcp/1", local_networks()) for i in found)
