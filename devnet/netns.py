"""A real network partition for devnets: two Linux network namespaces joined by one link.

::

    half A (namespace)  10.231.0.1 ── veth ── 10.231.0.2  half B (namespace)
         │ 10.232.1.1                                 10.232.2.1 │
         └──── veth ── 10.232.1.254 (this host) 10.232.2.254 ── veth ──┘

Daemons of a half listen on its address on the A–B link, so a partition is that link going
down, and healing it coming back up: established connections blackhole rather than fail, as
they do when a real network splits. Each half also has a management link to this host that
the partition never touches, so the devnet keeps reading every daemon's local API (which listens
on the management address). This host does not forward between the halves. Needs root and
``ip`` (iproute2).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
from dataclasses import dataclass

from open1b.protocol import Open1bError


class NetnsUnavailable(Open1bError):
    """This machine cannot make network namespaces here (not root, no iproute2, or not allowed)."""


@dataclass(frozen=True)
class Half:
    namespace: str
    address: str  # on the A–B link: where this half's daemons listen
    api_address: str  # on the management link: where their local APIs listen

    @property
    def prefix(self) -> tuple[str, ...]:
        return ("ip", "netns", "exec", self.namespace)


class Partition:
    """``with Partition() as (a, b): ... p.split() ... p.heal()``; everything is removed on exit."""

    def __init__(self) -> None:
        tag = f"{TAG_PREFIX}{os.getpid() % 100000}"
        self.ns = (f"{tag}a", f"{tag}b")
        self.link = (f"{tag}ab", f"{tag}ba")
        self.mgmt = ((f"{tag}ma", f"{tag}mah"), (f"{tag}mb", f"{tag}mbh"))
        self.halves = (Half(self.ns[0], "10.231.0.1", "10.232.1.1"), Half(self.ns[1], "10.231.0.2", "10.232.2.1"))
        self.split_count = 0

    def __enter__(self) -> tuple[Half, Half]:
        if os.geteuid() != 0 or shutil.which("ip") is None:
            raise NetnsUnavailable("network namespaces unavailable: they need root and iproute2's `ip`")
        # Every partition uses the same host addresses: one at a time on a host (a second waits).
        self._lock = open(LOCK_PATH, "a")
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        clear_stale()
        try:
            self._setup()
        except NetnsUnavailable:
            self._teardown()
            raise
        return self.halves

    def __exit__(self, *exc) -> None:
        self._teardown()

    def _setup(self) -> None:
        a, b = self.ns
        for ns in self.ns:
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("link", "add", self.link[0], "type", "veth", "peer", "name", self.link[1])
        for ns, dev, half in ((a, self.link[0], self.halves[0]), (b, self.link[1], self.halves[1])):
            _ip("link", "set", dev, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{half.address}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
        for ns, (inner, outer), half, net in ((a, self.mgmt[0], self.halves[0], 1),
                                              (b, self.mgmt[1], self.halves[1], 2)):
            _ip("link", "add", inner, "type", "veth", "peer", "name", outer)
            _ip("link", "set", inner, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{half.api_address}/24", "dev", inner)
            _ip("-n", ns, "link", "set", inner, "up")
            _ip("addr", "add", f"10.232.{net}.254/24", "dev", outer)
            _ip("link", "set", outer, "up")

    def split(self) -> None:
        _ip("-n", self.ns[0], "link", "set", self.link[0], "down")
        self.split_count += 1

    def heal(self) -> None:
        _ip("-n", self.ns[0], "link", "set", self.link[0], "up")

    def _teardown(self) -> None:
        for inner, outer in self.mgmt:
            subprocess.run(["ip", "link", "del", outer], capture_output=True)
        for ns in self.ns:  # deleting a namespace deletes the links inside it
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self._lock.close()  # releases the host's partition lock


TAG_PREFIX = "o1b"
LOCK_PATH = "/run/open1b-netns.lock"  # root-only, as network namespaces are
_OURS = re.compile(rf"^{TAG_PREFIX}(\d+)(a|b|ma|mb|mah|mbh|ab|ba)$")


def clear_stale(ours: re.Pattern = _OURS) -> list[str]:
    """Delete the namespaces and host links a killed devnet left behind (its process is gone):
    their host addresses are the same ones every run of that topology uses, so a leftover would
    make the next one's management links unreachable. ``ours`` names a topology's namespaces and
    links, with the owning process ID as its first group (the partition's by default; the NAT
    topology passes its own). Returns what it deleted."""
    live = {int(p) % 100000 for p in os.listdir("/proc") if p.isdigit()}
    listed = [line.split()[0] for line in _out("ip", "netns", "list").splitlines() if line.strip()]
    links = [line.split()[0].split("@")[0] for line in _out("ip", "-br", "link").splitlines() if line.strip()]
    deleted = []
    for kind, names in (("netns", listed), ("link", links)):
        for name in names:
            match = ours.match(name)
            if match and int(match.group(1)) not in live:
                subprocess.run(["ip", kind, "del", name], capture_output=True)
                deleted.append(name)
    return deleted


def _out(*args: str) -> str:
    return subprocess.run(list(args), capture_output=True, text=True).stdout


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise NetnsUnavailable(f"network namespaces unavailable: ip {' '.join(args)}: {proc.stderr.strip()}")
