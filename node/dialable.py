"""Which of a peer's addresses this node can dial: never a private-range address of a network it
is not on.

Peers hand out each other's addresses (identify, DHT answers), and a node behind NAT announces
its LAN address, since it has no other. Dialled from elsewhere, such an address leads nowhere,
or — worse — to a host of the dialler's own LAN, or into a firewall that drops the SYN, where a
dial waits the kernel's connect timeout (minutes). An address is dialable when its IP is global,
loopback (this machine), or inside the network of one of this machine's interfaces (the same
LAN). Addresses that are not IPv4 are not judged here (a ``/p2p-circuit`` address is judged by
its relay's IP, the address it dials).
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
from typing import Iterable

from multiaddr import Multiaddr

SIOCGIFADDR = 0x8915
SIOCGIFNETMASK = 0x891B

Networks = tuple[ipaddress.IPv4Network, ...]


def interfaces() -> tuple[ipaddress.IPv4Interface, ...]:
    """This machine's IPv4 interface addresses with their netmasks, as ``ip addr`` shows them (Linux)."""
    found = set()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name[:15].encode())
            try:  # each answer is an ifreq: its sockaddr_in starts at byte 16, the address at 20
                address = socket.inet_ntoa(fcntl.ioctl(probe.fileno(), SIOCGIFADDR, request)[20:24])
                netmask = socket.inet_ntoa(fcntl.ioctl(probe.fileno(), SIOCGIFNETMASK, request)[20:24])
            except OSError:  # no IPv4 address on it
                continue
            found.add(ipaddress.IPv4Interface(f"{address}/{netmask}"))
    return tuple(sorted(found))


def local_networks() -> Networks:
    """The networks this machine's interfaces are on."""
    return tuple(sorted({i.network for i in interfaces()}))


def ip4_of(addr: Multiaddr | str) -> str | None:
    """The first IPv4 address in ``addr`` (for a circuit address: its relay's), or None."""
    try:
        return Multiaddr(str(addr)).value_for_protocol("ip4")
    except Exception:
        return None


def is_circuit(addr: Multiaddr | str) -> bool:
    return "/p2p-circuit" in str(addr)


def dialable(addr: Multiaddr | str, networks: Networks) -> bool:
    """Whether a dial of ``addr`` can reach anyone: see the module's docstring."""
    host = ip4_of(addr)
    if host is None:
        return True
    ip = ipaddress.IPv4Address(host)
    if ip.is_global or ip.is_loopback:
        return True
    return any(ip in net for net in networks)


def dialable_only(addrs: Iterable[Multiaddr], networks: Networks) -> list[Multiaddr]:
    return [a for a in addrs if dialable(a, networks)]


def interface_ipv4s() -> list[str]:
    """This machine's IPv4 interface addresses (what a listener on 0.0.0.0 can be reached at),
    loopback last: it serves only this machine."""
    found = {str(i.ip) for i in interfaces()}
    return sorted(found, key=lambda ip: (ipaddress.ip_address(ip).is_loopback, ip))
