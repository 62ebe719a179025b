"""A devnet's listen ports (devnet/daemons.py): reserved from the moment they are planned until
the devnet stops, and still the node's own to listen on."""

import errno
import socket

import pytest
import trio

from open1b.devnet.daemons import Daemons
from open1b.node.p2p import open_p2p

from .conftest import ident


def _bind_plainly(port: int) -> None:
    """A bind as any other socket makes it: another process's, another devnet's pick."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", port))


def test_a_planned_port_is_nobody_elses_until_the_devnet_stops_and_its_node_listens_on_it(tmp_path):
    daemons = Daemons(tmp_path, tmp_path, redundancy=1)
    ports = [int(addr.split("/")[4]) for addr in daemons.plan(2)]
    for port in ports:  # while the run is trained, and between a crash and a restart
        with pytest.raises(OSError) as taken:
            _bind_plainly(port)
        assert taken.value.errno == errno.EADDRINUSE

    async def listen(port: int) -> None:
        # what the daemon does: the probe, py-libp2p's listener (SO_REUSEPORT), the check that
        # no stranger listens on the port
        async with open_p2p(ident(91), "127.0.0.1", port) as node:
            assert node.listen_port == port

    # (once: py-libp2p leaves its listener open in the process after the host closes; a restarted
    # node is a new process)
    trio.run(listen, ports[0])
    daemons.stop()
    _bind_plainly(ports[1])
