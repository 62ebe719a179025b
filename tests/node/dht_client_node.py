"""One libp2p node for the DHT client-mode test (tests/node/test_dht_client_nat.py), run inside a
network namespace. It prints JSON lines; ``{"addr": …}`` once listening. Then:

* ``--home PEER_ID`` (a node on the internet): once ``PEER_ID`` is connected and no longer lists
  the KAD protocol (it went client), reads the test claim from the network until it finds it and
  prints who signed it, whether ``PEER_ID`` is in its routing table and whether a KAD stream to it
  opens;
* otherwise (a node at home): checks its reachability (peers' dial-backs) until it has a verdict, prints it,
  its DHT mode and its routing table, then claims the test slot through the DHT and prints whether
  the network showed its claim.

It keeps serving until killed.

    python -m tests.node.dht_client_node --seed N --listen HOST:PORT [--dial ADDR ...] [--home PEER_ID]
"""

import argparse
import json
import random
import sys
import time

import trio
from libp2p.kad_dht.common import PROTOCOL_ID as KAD_PROTOCOL
from libp2p.peer.id import ID

from open1b.node.claim_records import ClaimAgent, ClaimRecords, DhtClaimBoard
from open1b.node.p2p import open_p2p
from open1b.node.planner import Candidate
from open1b.node.reachability import DIALBACK_PROTOCOL, DialBackServer, ReachabilityMonitor
from open1b.protocol import Claim, Identity, claim_key
from open1b.protocol.claims import CLAIM_NAMESPACE
from open1b.protocol.hashing import blake2b256
from open1b.protocol.identity import peer_id_from_public_key

RUN = blake2b256(b"dht-client-nat-test-run")
STEP, SLOT = 3, 0


def seeded(seed: int) -> Identity:
    return Identity(blake2b256(b"dht-client-nat-test", bytes([seed])))


def say(**what) -> None:
    print(json.dumps(what), flush=True)


def lists_kad(node, peer: ID) -> bool | None:
    """Whether ``peer`` lists the KAD protocol (identify); None before it was identified."""
    try:
        return str(KAD_PROTOCOL) in (node.host.get_peerstore().get_protocols(peer) or ())
    except Exception:
        return None


async def as_internet_node(node, home: str) -> None:
    home_id = ID.from_base58(home)
    with trio.fail_after(120):
        while home not in node.connected_peers() or lists_kad(node, home_id) is not False:
            await trio.sleep(0.2)
        found = None
        while found is None:
            found = await node.get_record(claim_key(RUN, STEP, SLOT), from_network=True)
            await trio.sleep(0.5)
    kad_stream_opens = False
    with trio.move_on_after(10):
        try:
            stream = await node.host.new_stream(home_id, [KAD_PROTOCOL])
            kad_stream_opens = True
            await stream.reset()
        except Exception:
            pass
    say(claimant=peer_id_from_public_key(Claim.decode(found).claimant),
        home_in_routing_table=home_id in node.dht.routing_table.get_peer_ids(), kad_stream_opens=kad_stream_opens)


async def as_home_node(node, identity: Identity, seed: int) -> None:
    monitor = ReachabilityMonitor(node, lambda: node.listen_port, random.Random(seed), trio.sleep)
    while (found := await monitor.check()).state == "unknown":  # too few peers answered yet: as the daemon, again
        await trio.sleep(1)
    say(reachability=found.state, dht_mode="client" if node.dht.client else "server",
        routing_table=sorted(p.to_base58() for p in node.dht.routing_table.get_peer_ids()))
    agent = ClaimAgent(identity, DhtClaimBoard(node), lease_s=600, clock=lambda: int(time.time()), sleep=trio.sleep,
                       rng=random.Random(seed))
    claim = await agent.try_claim(RUN, Candidate(step=STEP, deficit=1, disputed=False, score=0, slots=1,
                                                 attesters=frozenset()))
    say(claimed=claim is not None)


async def main(args: argparse.Namespace) -> None:
    identity = seeded(args.seed)
    host, port = args.listen.rsplit(":", 1)
    async with open_p2p(identity, host, int(port)) as node:
        node.set_stream_handler(DIALBACK_PROTOCOL, DialBackServer().handle)
        node.register_record_validator(CLAIM_NAMESPACE, ClaimRecords())
        say(addr=node.addrs[0])
        for addr in args.dial:
            await node.connect(addr)
        if args.home:
            await as_internet_node(node, args.home)
        else:
            await as_home_node(node, identity, args.seed)
        await trio.sleep_forever()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--listen", required=True)
    p.add_argument("--dial", action="append", default=[])
    p.add_argument("--home", default="")
    trio.run(main, p.parse_args(sys.argv[1:]))
