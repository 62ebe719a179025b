"""A fixed one-way delay between two network interfaces, in user space: the NAT topology's way to
add latency on a kernel without ``netem`` or ``fq`` (devnet/nat_topology.py).

    python -m open1b.devnet.delay_line IFACE_A IFACE_B DELAY_MS

Run inside a namespace that holds both interfaces (and no addresses): every frame that arrives on
one is sent out of the other ``DELAY_MS`` later, in order, in both directions — an Ethernet cable
that is that long. Frames are read and written with their virtio-net header (``PACKET_VNET_HDR``),
so the large GSO segments that veth pairs carry pass whole, offload flags included, instead of
being refused as larger than the MTU. Prints ``ready`` once both interfaces are open; runs until
killed.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections import deque

SOL_PACKET, PACKET_VNET_HDR = 263, 15  # <linux/socket.h>, <linux/if_packet.h>
ETH_P_ALL = 0x0003
MAX_FRAME = 10 + 65536 + 14  # virtio-net header + a 64 KiB GSO segment + its Ethernet header


def _open(iface: str) -> socket.socket:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.bind((iface, 0))
    return sock


def _carry(source: socket.socket, sink: socket.socket, delay_s: float) -> None:
    """Frames from ``source`` to ``sink``, each held until ``delay_s`` after it arrived."""
    line: deque[tuple[float, bytes]] = deque()
    ready = threading.Condition()

    def send() -> None:
        while True:
            with ready:
                while not line:
                    ready.wait()
                due, frame = line.popleft()
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            try:
                sink.send(frame)
            except OSError:  # e.g. the far interface is down: the frame is lost, as on a cable
                pass

    threading.Thread(target=send, daemon=True).start()
    while True:
        frame, (_, _, kind, *_) = source.recvfrom(MAX_FRAME)
        if kind == socket.PACKET_OUTGOING:  # our own sends out of this interface, seen again
            continue
        with ready:
            line.append((time.monotonic() + delay_s, frame))
            ready.notify()


def main() -> None:
    a_name, b_name, delay_ms = sys.argv[1], sys.argv[2], float(sys.argv[3])
    a, b = _open(a_name), _open(b_name)
    print("ready", flush=True)
    threading.Thread(target=_carry, args=(a, b, delay_ms / 1000), daemon=True).start()
    _carry(b, a, delay_ms / 1000)


if __name__ == "__main__":
    main()
