"""A pubsub frame that is not a pubsub RPC, on real py-libp2p hosts on loopback: the receiving
node counts it against the sender and keeps running."""

from contextlib import AsyncExitStack

import trio
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11
from libp2p.utils.varint import encode_varint_prefixed

from open1b.node.p2p import open_p2p
from open1b.protocol import Outcome

from .conftest import ident

TOPIC = "/open1b/test"


def test_a_frame_that_is_not_an_rpc_is_a_reject_and_the_node_keeps_running():
    received = []

    async def main():
        with trio.fail_after(60):
            async with AsyncExitStack() as stack:
                a, c = [await stack.enter_async_context(open_p2p(ident(40 + i), "127.0.0.1", 0)) for i in range(2)]
                await c.connect(a.addrs[0])
                stream = await c.host.new_stream(a.host.get_id(), [PROTOCOL_ID_V11])
                await stream.write(encode_varint_prefixed(b"\\xff" * 8))  # field 31, wire type 7: no such type
                while a.rejected.get(c.peer_id) != 1:
                    await trio.sleep(0.02)
                # a still gossips with c: its host did not end
                for node in (a, c):
                    node.set_validator(TOPIC, lambda author, data: Outcome.ACCEPT)

                async def handler(author, data):
                    received.append(data)

                await a.subscribe(TOPIC, handler)
                await c.subscribe(TOPIC, lambda author, data: trio.sleep(0))
                await c.pubsub.wait_for_mesh(a.host.get_id(), TOPIC, timeout=20)
                await c.publish(TOPIC, b"fine")
                while not received:
                    await trio.sleep(0.02)

    trio.run(main)
    assert received == [b"fine"]
