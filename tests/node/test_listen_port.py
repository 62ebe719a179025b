"""The libp2p port stays this node's (node/listen_port.py): its listener has SO_REUSEPORT (for
hole punching), so another socket could share it; the node refuses, in one line."""

import socket

import pytest
import trio

from open1b.node.listen_port import listening_inodes, socket_inode, strangers
from open1b.node.p2p import NetworkError, check_exclusive, listener_inodes, open_p2p

from .conftest import ident


def _reuseport_listener(port: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock


def test_a_stranger_on_our_port_is_found_whether_it_came_before_or_after_us():
    async def main():
        with trio.fail_after(30):
            async with open_p2p(ident(70), "127.0.0.1", 0) as node:
                port = node.listen_port
                ours = listener_inodes(node)
                assert ours and ours <= listening_inodes(port) and not strangers(port, ours)
                check_exclusive(node)
                # our listener has SO_REUSEPORT, so this one binds beside it: the kernel would split
                # our inbound connections with it
                with _reuseport_listener(port) as intruder:
                    assert strangers(port, ours) == {socket_inode(intruder.fileno())}
                    with pytest.raises(NetworkError, match="SO_REUSEPORT") as refused:
                        check_exclusive(node)
                    assert "\n" not in str(refused.value)
            # before us: the probe bound without SO_REUSEPORT fails, and the node does not start
            with _reuseport_listener(0) as earlier:
                with pytest.raises(ExceptionGroup) as refused:  # (from inside open_p2p's nursery)
                    async with open_p2p(ident(71), "127.0.0.1", earlier.getsockname()[1]):
                        pass
                assert refused.group_contains(NetworkError, match="Address already in use", depth=None)

    trio.run(main)
