"""One libp2p node for the NAT reachability test (tests/node/test_reachability_nat.py), run inside a
network namespace: it listens, serves dial-backs, dials the peers it is given, waits until
``--peers`` are connected, asks them to dial it back, prints its verdict as one JSON line, and
keeps serving until killed.

    python -m tests.node.reachability_node --seed N --listen HOST [--dial ADDR ...] --peers K
"""

import argparse
import json
import random
import sys

import trio

from open1b.node.p2p import open_p2p
from open1b.node.reachability import DIALBACK_PROTOCOL, DialBackServer, ask_peers, verdict
from open1b.protocol import Identity
from open1b.protocol.hashing import blake2b256


async def main(args: argparse.Namespace) -> None:
    identity = Identity(blake2b256(b"reachability-nat-test", bytes([args.seed])))
    async with open_p2p(identity, args.listen, 0) as node:
        node.set_stream_handler(DIALBACK_PROTOCOL, DialBackServer().handle)
        print(json.dumps({"addr": node.addrs[0]}), flush=True)
        for addr in args.dial:
            await node.connect(addr)
        while len(node.connected_peers()) < args.peers:
            await trio.sleep(0.1)
        found = verdict(await ask_peers(node, node.listen_port, random.Random(args.seed)))
        print(json.dumps(found.as_json()), flush=True)
        await trio.sleep_forever()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--listen", required=True)
    p.add_argument("--dial", action="append", default=[])
    p.add_argument("--peers", type=int, required=True)
    trio.run(main, p.parse_args(sys.argv[1:]))
