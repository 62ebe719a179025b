"""That the libp2p port is this node's alone.

TCP hole punching (DCUtR, :mod:`.relays`) needs the listener to have SO_REUSEPORT: the punch dials
out *from* the listening port, so that the NAT maps it as it mapped our other connections. With
that option, a second socket of the same user may bind and listen on the same port, and the
kernel then splits incoming connections between the two — peers would reach a stranger at our
address. Two guards keep the port ours: before listening, a probe bound *without* SO_REUSEPORT
fails if anyone holds the port (``p2p._check_listen``); after, :func:`check_exclusive` finds
any listening socket on the port that is not one of our listener's (Linux: ``/proc/net/tcp``).
"""

from __future__ import annotations

import os
from pathlib import Path

LISTEN = "0A"  # a socket's state in /proc/net/tcp: TCP_LISTEN


def listening_inodes(port: int, proc: Path = Path("/proc/net")) -> set[int]:
    """The inodes of every listening TCP socket on ``port`` (IPv4 and IPv6), any process's."""
    found = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.add(int(fields[9]))
    return found


def socket_inode(fileno: int) -> int:
    return os.fstat(fileno).st_ino


def strangers(port: int, ours: set[int], proc: Path = Path("/proc/net")) -> set[int]:
    """Listening sockets on ``port`` that are not ``ours`` (by inode)."""
    return listening_inodes(port, proc) - ours
