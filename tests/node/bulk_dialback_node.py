"""One node for the bulk dial-back test (tests/node/test_bulk_dialback_nat.py), run inside a network
namespace; it prints JSON lines.

* ``--serve CACHE_DIR`` (the provider, at home): serves the blobs in CACHE_DIR on its bulk listener,
  answers dial-back requests, dials ``--dial`` over libp2p and serves until killed;
* ``--fetch WORKDIR EXPECTATION`` (the fetcher, on the internet): prints ``{"addr": …}``, waits for
  ``--provider`` to connect, asks how to open a bulk session with it and fetches the checkpoint
  (EXPECTATION: a pickled :class:`open1b.node.chunk_table.Expectation`); prints how, from whom and
  what it got.

    python -m tests.node.bulk_dialback_node --seed N --listen HOST:PORT (--serve DIR | --fetch DIR FILE)
        [--dial ADDR] [--provider PEER_ID]
"""

import argparse
import json
import pickle
import sys
from pathlib import Path

import trio

from open1b.node.blobs import BlobCache, file_digest
from open1b.node.bulk import DIALBACK_PROTOCOL, BulkServer, find_bulk_peer
from open1b.node.checkpoint_fetch import fetch_checkpoint
from open1b.node.p2p import open_p2p
from open1b.protocol import Identity
from open1b.protocol.hashing import blake2b256


def seeded(seed: int) -> Identity:
    return Identity(blake2b256(b"bulk-dialback-nat-test", bytes([seed])))


def say(**what) -> None:
    print(json.dumps(what), flush=True)


async def main(args: argparse.Namespace) -> None:
    identity = seeded(args.seed)
    host, port = args.listen.rsplit(":", 1)
    cache_dir = Path(args.serve or args.fetch[0])
    server = BulkServer(BlobCache(cache_dir, 1 << 34), identity)
    async with open_p2p(identity, host, int(port)) as node, trio.open_nursery() as nursery:
        await nursery.start(server.serve, host, 0)
        node.set_stream_handler(DIALBACK_PROTOCOL, server.dial_back)
        say(addr=node.addrs[0])
        for addr in args.dial:
            await node.connect(addr)
        if args.fetch:
            expect = pickle.loads(Path(args.fetch[1]).read_bytes())
            with trio.fail_after(60):
                while args.provider not in node.connected_peers():
                    await trio.sleep(0.1)
            provider = await find_bulk_peer(node, args.provider, server)
            report = await fetch_checkpoint(server.cache, identity, [provider], expect)
            say(provider=type(provider).__name__, dialled_back=report.dialled_back,
                bytes_by_peer=report.bytes_by_peer, address_ok=file_digest(report.path) == expect.address)
        await trio.sleep_forever()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--listen", required=True)
    p.add_argument("--serve", default="")
    p.add_argument("--fetch", nargs=2)
    p.add_argument("--dial", action="append", default=[])
    p.add_argument("--provider", default="")
    trio.run(main, p.parse_args(sys.argv[1:]))
