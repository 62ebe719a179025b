"""One libp2p node for the hole-punch test (tests/node/test_hole_punch_nat.py), run inside a network
namespace. It prints JSON lines: ``{"addr": …}`` once listening; with ``--private``, ``{"circuit":
…}`` once it holds a relay reservation; with ``--target``, after dialling that circuit address,
``{"kind": …, "seconds": …, "hole_punches": {…}}`` once the connection is direct or
``--wait`` seconds have passed; with ``--wait-for-peer``, the same once that peer's connection
to it is direct. It keeps serving until killed.

    python -m tests.node.relay_node --seed N --listen HOST:PORT [--relay] [--private]
        [--dial ADDR ...] [--target CIRCUIT_ADDR] [--wait S] [--wait-for-peer PEER_ID]
"""

import argparse
import json
import sys

import trio
from libp2p.peer.id import ID
from multiaddr import Multiaddr

from open1b.node.dialable import is_circuit
from open1b.node.p2p import open_p2p
from open1b.protocol import Identity
from open1b.protocol.hashing import blake2b256


def seeded(seed: int) -> Identity:
    return Identity(blake2b256(b"hole-punch-nat-test", bytes([seed])))


def say(**what) -> None:
    print(json.dumps(what), flush=True)


async def settled(node) -> None:
    """Until the punch that made the connection direct has returned (it is counted then), 10 s at most."""
    with trio.move_on_after(10):
        while not (node.relays.hole_punch.attempts or node.relays.hole_punch.answered):
            await trio.sleep(0.1)


async def main(args: argparse.Namespace) -> None:
    identity = seeded(args.seed)
    host, port = args.listen.rsplit(":", 1)
    async with open_p2p(identity, host, int(port), relay_service=args.relay) as node:
        node.reachability = "private" if args.private else "public"  # as the dial-back check finds them there
        say(addr=node.addrs[0])
        for addr in args.dial:
            await node.connect(addr)
        if args.private:
            while not node.relays.reserved:
                await trio.sleep(0.1)
            say(circuit=next(a for a in node.addrs if is_circuit(a)))
            if args.wait_for_peer:  # a peer that dialled us through the relay: report once direct (or not)
                with trio.move_on_after(args.wait):
                    while args.wait_for_peer not in node.connected_peers():
                        await trio.sleep(0.1)
                    while node.relays.kind(args.wait_for_peer) != "direct":
                        await trio.sleep(0.1)
                await settled(node)
                say(kind=node.relays.kind(args.wait_for_peer), hole_punches=node.relays.status()["hole_punches"])
        if args.target:
            peer = args.target.rsplit("/p2p/", 1)[1]
            node.host.get_peerstore().add_addrs(ID.from_base58(peer), [Multiaddr(args.target)], 3600)
            started = trio.current_time()
            assert await node.relays.dial(peer), "no circuit to the target"
            with trio.move_on_after(args.wait):
                while node.relays.kind(peer) != "direct":
                    await trio.sleep(0.1)
            seconds = round(trio.current_time() - started, 1)
            await settled(node)
            say(kind=node.relays.kind(peer), seconds=seconds,
                hole_punches=node.relays.status()["hole_punches"])
        await trio.sleep_forever()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--listen", required=True)
    p.add_argument("--relay", action="store_true")
    p.add_argument("--private", action="store_true")
    p.add_argument("--dial", action="append", default=[])
    p.add_argument("--target", default="")
    p.add_argument("--wait", type=float, default=40.0)
    p.add_argument("--wait-for-peer", default="")
    trio.run(main, p.parse_args(sys.argv[1:]))
