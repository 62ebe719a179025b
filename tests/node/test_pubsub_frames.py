"""A pubsub frame that is not a pubsub RPC, on real py-libp2p hosts on loopback: the receiving
node counts it against the sender and keeps running."""

from contextlib import AsyncExitStack

import trio
from libp2p.custom_types import TProtocol
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11
from libp2p.pubsub.pb import rpc_pb2
from libp2p.utils.varint import decode_uvarint, encode_uvarint, encode_varint_prefixed

from open1b.protocol import Outcome

from .loopback_hosts import connected_pair, gossip_from

TOPIC = "/open1b/test"
SLOW_PROTOCOL = TProtocol("/open1b/test-slow-reader/1.0.0")


def test_a_frame_that_is_not_an_rpc_is_a_reject_and_the_node_keeps_running():
    received = []

    async def main():
        with trio.fail_after(60):
            async with AsyncExitStack() as stack:
                a, c = await connected_pair(stack, 40)
                stream = await c.host.new_stream(a.host.get_id(), [PROTOCOL_ID_V11])
                await stream.write(encode_varint_prefixed(b"\\xff" * 8))  # field 31, wire type 7: no such type
                while a.rejected.get(c.peer_id) != 1:
                    await trio.sleep(0.02)
                # a still gossips with c: its host did not end
                for node in (a, c):
                    node.set_validator(TOPIC, lambda author, data: Outcome.ACCEPT)
                await gossip_from(c, a, TOPIC, received)
                await c.publish(TOPIC, b"fine")
                while not received:
                    await trio.sleep(0.02)

    trio.run(main)
    assert received == [b"fine"]


def test_concurrent_writes_to_a_slow_reader_stay_whole_frames():
    """Gossipsub writes to a peer's stream from many tasks at once (each forward, each control
    message), and py-libp2p's yamux takes its write lock per chunk: a write that runs out of send
    window waits with the lock released, and another write's chunks went in between. A reader that
    lags (a loaded machine) then got frames that are not RPCs from honest peers, counted them as
    rejects and banned its peers (an under-load copier + liar devnet: one auditor banned the
    publisher and every other node within a minute and audited nothing). Here: four RPCs larger
    than yamux's 256 KiB window, written at once to a reader that reads slowly."""
    rpcs = [rpc_pb2.RPC(publish=[rpc_pb2.Message(data=bytes([i]) * 600_000, topicIDs=[TOPIC])]) for i in range(4)]
    frames: list[bytes] = []

    async def slow_reader(stream):
        buffer = bytearray()
        while len(frames) < len(rpcs):
            await trio.sleep(0.01)
            chunk = await stream.read(32768)
            if not chunk:
                return
            buffer += chunk
            while True:
                try:
                    size, used = decode_uvarint(bytes(buffer[:10])), len(encode_uvarint(decode_uvarint(bytes(buffer[:10]))))
                except Exception:
                    break
                if len(buffer) < used + size:
                    break
                frames.append(bytes(buffer[used:used + size]))
                del buffer[:used + size]

    async def main():
        with trio.fail_after(120):
            async with AsyncExitStack() as stack:
                a, c = await connected_pair(stack, 44)
                a.host.set_stream_handler(SLOW_PROTOCOL, slow_reader)
                stream = await c.host.new_stream(a.host.get_id(), [SLOW_PROTOCOL])
                async with trio.open_nursery() as nursery:
                    for rpc in rpcs:
                        nursery.start_soon(c.pubsub.write_msg, stream, rpc)
                while len(frames) < len(rpcs):
                    await trio.sleep(0.05)

    trio.run(main)
    assert sorted(frames) == sorted(rpc.SerializeToString() for rpc in rpcs)
