"""sd_notify without libsystemd: one datagram to ``$NOTIFY_SOCKET`` (a no-op elsewhere).

The unit in deploy/ is ``Type=notify``: systemd considers the node started only when it says
``READY=1``, which it does once its libp2p and API listeners are up.
"""

from __future__ import annotations

import os
import socket


def notify(state: str) -> bool:
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # abstract namespace
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.connect(address)
        sock.sendall(state.encode())
    return True
