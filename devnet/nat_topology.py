"""Home networks behind NAT routers, on shaped links, for devnets and benchmarks (issue 27 item 5).

::

                        ┌──────────── internet (namespace) ─────────────┐
                        │  11.240.0.1 on lo: public nodes (bootstrap,    │
                        │  relay, observer) listen here                  │
                        │  11.241.1.1            11.241.2.1    …         │
                        └────┬───────────────────────┬──────────────────┘
                             │ veth (WAN)             │ veth (WAN)
                             │ [delay line]           │ [delay line]   (with delay_ms)
                  11.241.1.2 │ tbf: uplink  11.241.2.2 │ tbf: uplink
            ┌─── router A (namespace) ──┐  ┌─── router B (namespace) ──┐
            │ MASQUERADE (port-         │  │ MASQUERADE --random-fully │
            │ preserving); inbound NEW  │  │ (symmetric-like); inbound │
            │ dropped unless forwarded  │  │ NEW dropped unless fwd.   │
            └────┬──────────────────────┘  └────┬──────────────────────┘
                 │ veth (LAN) tbf: downlink      │ veth (LAN)
      192.168.1.2│                    192.168.2.2│
            home A (namespace)            home B (namespace)      nodes listen here

      management: this host 10.242.k.254 ── veth ── 10.242.k.1 in the internet (k = 0) and in each
      home (k = 1, 2, …), for the daemons' local APIs only

Each home's nodes share its namespace (one address, a port each). A router masquerades the home
behind its WAN address and, as a typical home firewall does, silently drops unsolicited inbound
connections (no RST), except on the TCP ports it forwards to the home (what a UPnP mapping would
open). Shaping is a token bucket (``tc tbf``) on the router's egress: WAN for the uplink, LAN for
the downlink. This kernel has neither ``netem`` nor ``fq``, so a home's ``delay_ms`` is added by
a delay line (devnet/delay_line.py): its WAN link becomes two veth pairs with a namespace between
them, where a small process passes every frame on ``delay_ms`` later in each direction. Without
it, round trips are the sub-millisecond ones of veth pairs plus whatever a full token-bucket queue
adds.

The internet does not route the homes' private addresses, nodes have no route over their
management link beyond its /24, and this host does not forward: the only path between homes, and
between a home and the internet, is through its router. Needs root, iproute2 (``ip``, ``tc``) and
iptables.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Literal, Sequence

from . import netns
from .netns import NetnsUnavailable

Nat = Literal["port-preserving", "random"]
"""``port-preserving``: plain MASQUERADE, which keeps a connection's source port when it is free
(a hole punch can predict it); ``random``: MASQUERADE --random-fully, a fresh random port per
connection (symmetric-like: the port a peer observed is not the one the next connection gets)."""

INTERNET_ADDRESS = "11.240.0.1"
"""The internet side uses global-range addresses (11.0.0.0/8; nothing leaves the namespaces) so that
nodes judge them as they would real internet addresses: a private-range address (RFC 1918) is
reachable on its own network only, and a node neither announces it as public nor dials it there."""
QUEUE_LATENCY_MS = 50
"""The most a packet waits in a shaper's queue: enough buffer for TCP to keep a 40 Mbit/s link
busy (~250 KB), not so much that a full queue adds seconds of delay."""


@dataclass(frozen=True)
class HomeSpec:
    name: str
    nat: Nat = "port-preserving"
    uplink_mbit: float | None = 40.0
    downlink_mbit: float | None = None
    forwards: tuple[int, ...] = ()  # TCP ports the router forwards to the home's address
    delay_ms: float = 0.0  # one-way delay between the router and the internet (round trip: twice)


@dataclass(frozen=True)
class Site:
    """A namespace where nodes run: the internet, or one home."""

    name: str
    namespace: str
    address: str  # where its nodes listen
    api_address: str  # its end of the management link (local APIs)
    public_address: str  # the address the internet sees its connections come from

    @property
    def prefix(self) -> tuple[str, ...]:
        """Prepend to a command line to run it in this site."""
        return ("ip", "netns", "exec", self.namespace)


class NatTopology:
    """``with NatTopology([HomeSpec("a"), HomeSpec("b", nat="random")]) as net: net.internet,
    net.homes["a"] …``; every namespace and host link is removed on exit, also after a failed
    setup."""

    def __init__(self, homes: Sequence[HomeSpec]) -> None:
        if not 1 <= len(homes) <= MAX_HOMES or len({h.name for h in homes}) != len(homes):
            raise ValueError(f"between 1 and {MAX_HOMES} homes with distinct names")
        self.specs = list(homes)
        self.tag = f"{TAG_PREFIX}{os.getpid() % 100000}"
        self.internet = Site("internet", f"{self.tag}i", INTERNET_ADDRESS, "10.242.0.1", INTERNET_ADDRESS)
        self.homes = {spec.name: Site(spec.name, f"{self.tag}h{i}", f"192.168.{i}.2", f"10.242.{i}.1", f"11.241.{i}.2")
                      for i, spec in enumerate(self.specs, start=1)}
        self._lock = None
        self._lines: list[subprocess.Popen] = []

    def router(self, home: str) -> str:
        """The namespace of ``home``'s router."""
        return f"{self.tag}r{self._index(home)}"

    def _index(self, home: str) -> int:
        return [s.name for s in self.specs].index(home) + 1

    def __enter__(self) -> NatTopology:
        missing = [tool for tool in ("ip", "tc", "iptables") if shutil.which(tool) is None]
        if os.geteuid() != 0 or missing:
            raise NetnsUnavailable("the NAT topology needs root, iproute2 (ip, tc) and iptables"
                                   + (f"; missing: {', '.join(missing)}" if missing else "; not root"))
        # The management links use the same host addresses in every topology: one at a time.
        self._lock = open(LOCK_PATH, "a")
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        clear_stale()
        try:
            self._setup()
        except BaseException:
            self._teardown()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._teardown()

    def _setup(self) -> None:
        inet = self.internet.namespace
        _add_namespace(inet, forwarding=True)
        _run("ip", "-n", inet, "addr", "add", f"{INTERNET_ADDRESS}/32", "dev", "lo")
        self._management(inet, 0)
        for i, spec in enumerate(self.specs, start=1):
            router, home = self.router(spec.name), self.homes[spec.name]
            _add_namespace(router, forwarding=True)
            _add_namespace(home.namespace, forwarding=False)
            wan, lan = f"{self.tag}wr{i}", f"{self.tag}lr{i}"
            if spec.delay_ms:
                self._delay_line(i, spec.delay_ms)
            else:
                _veth(inet, f"{self.tag}wi{i}", f"11.241.{i}.1/24", router, wan, f"11.241.{i}.2/24")
            _veth(router, lan, f"192.168.{i}.1/24", home.namespace, f"{self.tag}lh{i}", f"{home.address}/24")
            _run("ip", "-n", router, "route", "add", "default", "via", f"11.241.{i}.1")
            _run("ip", "-n", home.namespace, "route", "add", "default", "via", f"192.168.{i}.1")
            self._firewall(router, wan, lan, spec, home.address)
            for dev, mbit in ((wan, spec.uplink_mbit), (lan, spec.downlink_mbit)):
                if mbit is not None:
                    shape(router, dev, mbit)
            self._management(home.namespace, i)

    def _delay_line(self, i: int, delay_ms: float) -> None:
        """Home ``i``'s WAN link as two veth pairs joined by a delay line in a namespace of its own
        (devnet/delay_line.py): the internet and the router still share one Ethernet segment."""
        line, router = f"{self.tag}d{i}", self.router(self.specs[i - 1].name)
        _add_namespace(line, forwarding=False)
        _run("ip", "netns", "exec", line, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1")  # no chatter of its own
        ends = f"{self.tag}xa{i}", f"{self.tag}xb{i}"
        _veth(self.internet.namespace, f"{self.tag}wi{i}", f"11.241.{i}.1/24", line, ends[0], None)
        _veth(router, f"{self.tag}wr{i}", f"11.241.{i}.2/24", line, ends[1], None)
        proc = subprocess.Popen(["ip", "netns", "exec", line, sys.executable, "-m", "open1b.devnet.delay_line",
                                 *ends, str(delay_ms)], stdout=subprocess.PIPE, text=True)
        self._lines.append(proc)
        if proc.stdout.readline().strip() != "ready":
            raise NetnsUnavailable(f"NAT topology: the delay line of home {i} did not start")

    @staticmethod
    def _firewall(router: str, wan: str, lan: str, spec: HomeSpec, home_address: str) -> None:
        ipt = ("ip", "netns", "exec", router, "iptables", "-w")
        _run(*ipt, "-t", "nat", "-A", "POSTROUTING", "-o", wan, "-j", "MASQUERADE",
             *(("--random-fully",) if spec.nat == "random" else ()))
        for port in spec.forwards:
            _run(*ipt, "-t", "nat", "-A", "PREROUTING", "-i", wan, "-p", "tcp", "--dport", str(port),
                 "-j", "DNAT", "--to-destination", f"{home_address}:{port}")
            _run(*ipt, "-A", "FORWARD", "-i", wan, "-o", lan, "-p", "tcp", "-d", home_address, "--dport", str(port),
                 "-j", "ACCEPT")
        _run(*ipt, "-A", "FORWARD", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT")
        _run(*ipt, "-A", "FORWARD", "-i", lan, "-o", wan, "-j", "ACCEPT")
        _run(*ipt, "-P", "FORWARD", "DROP")  # unsolicited inbound: dropped, never answered
        # The router itself answers nothing from the WAN but replies to what it sent.
        _run(*ipt, "-A", "INPUT", "-i", wan, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT")
        _run(*ipt, "-A", "INPUT", "-i", wan, "-j", "DROP")

    def _management(self, namespace: str, k: int) -> None:
        inner, outer = f"{self.tag}mn{k}", f"{self.tag}mh{k}"
        _run("ip", "link", "add", inner, "type", "veth", "peer", "name", outer)
        _run("ip", "link", "set", inner, "netns", namespace)
        _run("ip", "-n", namespace, "addr", "add", f"10.242.{k}.1/24", "dev", inner)
        _run("ip", "-n", namespace, "link", "set", inner, "up")
        _run("ip", "addr", "add", f"10.242.{k}.254/24", "dev", outer)
        _run("ip", "link", "set", outer, "up")

    def _teardown(self) -> None:
        for proc in self._lines:
            proc.kill()
            proc.wait()
        self._lines.clear()
        for k in range(len(self.specs) + 1):
            subprocess.run(["ip", "link", "del", f"{self.tag}mh{k}"], capture_output=True)
        lines = [f"{self.tag}d{i}" for i, s in enumerate(self.specs, start=1) if s.delay_ms]
        for ns in [self.internet.namespace, *(self.router(s.name) for s in self.specs),
                   *(h.namespace for h in self.homes.values()), *lines]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)  # and the links inside it
        if self._lock is not None:
            self._lock.close()  # releases the host's lock
            self._lock = None


def shape(namespace: str, dev: str, mbit: float) -> None:
    """Cap ``dev``'s egress in ``namespace`` at ``mbit`` Mbit/s with a token bucket (replacing
    any earlier cap). The bucket holds two full-size GSO packets, so veth's 64 KiB segments pass
    without being split, and the queue holds :data:`QUEUE_LATENCY_MS` of traffic."""
    _run("tc", "-n", namespace, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{mbit}mbit",
         "burst", "128kb", "latency", f"{QUEUE_LATENCY_MS}ms")


MAX_HOMES = 9  # interface names stay within Linux's 15 characters
TAG_PREFIX = "o1n"
LOCK_PATH = "/run/open1b-nat.lock"
_OURS = re.compile(rf"^{TAG_PREFIX}(\d+)(i|[rhd]\d|mh\d)$")


def clear_stale() -> list[str]:
    """Delete the namespaces and host links of a topology whose process is gone (a killed run):
    a leftover host link would hold the management addresses the next topology needs."""
    return netns.clear_stale(_OURS)


def _add_namespace(namespace: str, *, forwarding: bool) -> None:
    _run("ip", "netns", "add", namespace)
    _run("ip", "-n", namespace, "link", "set", "lo", "up")
    _run("ip", "netns", "exec", namespace, "sysctl", "-qw", f"net.ipv4.ip_forward={int(forwarding)}")


def _veth(ns_a: str, dev_a: str, addr_a: str, ns_b: str, dev_b: str, addr_b: str | None) -> None:
    _run("ip", "link", "add", dev_a, "netns", ns_a, "type", "veth", "peer", "name", dev_b, "netns", ns_b)
    for ns, dev, addr in ((ns_a, dev_a, addr_a), (ns_b, dev_b, addr_b)):
        if addr is not None:
            _run("ip", "-n", ns, "addr", "add", addr, "dev", dev)
        _run("ip", "-n", ns, "link", "set", dev, "up")


def _out(*args: str) -> str:
    return subprocess.run(list(args), capture_output=True, text=True).stdout


def _run(*args: str) -> None:
    proc = subprocess.run(list(args), capture_output=True, text=True)
    if proc.returncode != 0:
        raise NetnsUnavailable(f"NAT topology: {' '.join(args)}: {proc.stderr.strip()}")
