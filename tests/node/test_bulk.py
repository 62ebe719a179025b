"""The bulk session (node/bulk.py) on real loopback TCP: who may talk, what a frame may be."""

import logging
import socket
import struct
from contextlib import AsyncExitStack

import pytest
import trio
import trio.testing

from open1b.node.blobs import BlobCache
from open1b.node.bulk import (
    ADDRESS_PROTOCOL,
    DIALBACK_PROTOCOL,
    HANDSHAKE_TIMEOUT_S,
    HELLO_SIZE,
    MAX_DIALBACKS_PER_HOST,
    MAX_HANDSHAKES_PER_IP,
    MAX_RESPONSE,
    OP_RANGE,
    SIGNATURE_SIZE,
    BulkError,
    BulkPeer,
    BulkServer,
    DialBackPeer,
    HandshakeError,
    TokenBucket,
    address_handler,
    find_bulk_peer,
    open_channel,
    request,
    response,
    serve_bulk,
    server_handshake,
)
from open1b.node.p2p import NetworkError, open_p2p
from open1b.protocol.codec import decode, encode
from open1b.protocol.hashing import blake2b256
from open1b.protocol.identity import peer_id_from_public_key

from .conftest import ident
from .loopback_hosts import at_once, connected_to, tcp_listener

SERVER, CLIENT, OTHER = ident(60), ident(61), ident(62)


def test_session_moves_ranges_and_names_both_peers(tmp_path):
    source = tmp_path / "blob"
    source.write_bytes(bytes(range(256)) * 5000)
    cache = BlobCache(tmp_path / "cache", 1 << 30)
    digest = cache.add_file(source)

    async def main():
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                seen = []
                port = await nursery.start(lambda task_status: serve_bulk(
                    cache, SERVER, "127.0.0.1", 0, allow=lambda peer: not seen.append(peer), task_status=task_status))
                channel = await open_channel(BulkPeer(SERVER.peer_id, "127.0.0.1", port), CLIENT)
                assert channel.peer_id == SERVER.peer_id
                for offset in (0, 1000, 1_279_990):  # pipelined; the last range is clipped to the blob
                    await request(channel, OP_RANGE, digest, offset, 100)
                for offset, length in ((0, 100), (1000, 100), (1_279_990, 10)):
                    status, size, data = await response(channel, length)
                    assert (status, size, bytes(data)) == (0, 1_280_000, source.read_bytes()[offset:offset + length])
                await request(channel, OP_RANGE, bytes(32), 0, 100)
                assert (await response(channel, 0))[0] == 1  # not found: a status, no payload
                assert seen == [CLIENT.peer_id]  # the server learned who the client is
                await channel.aclose()
                nursery.cancel_scope.cancel()

    trio.run(main)


def test_handshake_refuses_wrong_peer_and_bad_signatures(tmp_path):
    async def wrong_signature(stream):
        await stream.receive_some(HELLO_SIZE)
        await stream.send_all(b"open1b/bulk/v1\x00\x00" + bytes(32 * 2 - 1) + b"\x09" + bytes(SIGNATURE_SIZE))

    async def main():
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                port = await nursery.start(serve_bulk, BlobCache(tmp_path, 1 << 20), SERVER, "127.0.0.1", 0)
                # the listener is SERVER, the client meant OTHER: refused before it signs anything
                with pytest.raises(HandshakeError, match="not " + OTHER.peer_id):
                    await open_channel(BulkPeer(OTHER.peer_id, "127.0.0.1", port), CLIENT)
                # a server that cannot sign for the key it names
                liar_port = await tcp_listener(nursery, wrong_signature)
                liar_id = peer_id_from_public_key(bytes(31) + b"\x09")
                with pytest.raises(HandshakeError, match="does not verify"):
                    await open_channel(BulkPeer(liar_id, "127.0.0.1", liar_port), CLIENT)
                # a client that cannot sign for its key: the server hangs up without a session
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                await stream.send_all(b"open1b/bulk/v1\x00\x00" + bytes(32) + CLIENT.public_key)
                got = b""
                while len(got) < HELLO_SIZE + SIGNATURE_SIZE:
                    got += await stream.receive_some()
                await stream.send_all(bytes(SIGNATURE_SIZE))
                assert await stream.receive_some() == b""  # closed
                # a client that signs, but offers a low-order ephemeral key (no shared secret)
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                hello_c = b"open1b/bulk/v1\x00\x00" + bytes(32) + CLIENT.public_key
                await stream.send_all(hello_c)
                got = b""
                while len(got) < HELLO_SIZE + SIGNATURE_SIZE:
                    got += await stream.receive_some()
                th = blake2b256(b"open1b/bulk/transcript/v1\x00", hello_c, got[:HELLO_SIZE])
                await stream.send_all(CLIENT.sign_raw(b"open1b/bulk/client/v1\x00" + th))
                assert await stream.receive_some() == b""  # closed
                nursery.cancel_scope.cancel()

    trio.run(main)


def test_server_refuses_peers_it_does_not_allow(tmp_path):
    async def main():
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                port = await nursery.start(lambda task_status: serve_bulk(
                    BlobCache(tmp_path, 1 << 20), SERVER, "127.0.0.1", 0, allow=lambda peer: peer != CLIENT.peer_id,
                    task_status=task_status))
                channel = await open_channel(BulkPeer(SERVER.peer_id, "127.0.0.1", port), CLIENT)
                with pytest.raises(BulkError):
                    await request(channel, OP_RANGE, bytes(32), 0, 1)
                    await response(channel, 0)
                nursery.cancel_scope.cancel()

    trio.run(main)


def test_oversize_and_mistagged_frames_are_refused():
    async def oversize(stream):
        channel = await server_handshake(stream, SERVER)
        await channel.receive(64)
        await stream.send_all(struct.pack("<I", MAX_RESPONSE + 1))  # and no body: the reader must not wait for it
        await trio.sleep_forever()

    async def mistagged(stream):
        channel = await server_handshake(stream, SERVER)
        await channel.receive(64)
        await stream.send_all(struct.pack("<I", 9) + bytes(9) + bytes(16))

    async def main():
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                for behaviour, message in ((oversize, "announced a frame of"), (mistagged, "wrong tag")):
                    port = await tcp_listener(nursery, behaviour)
                    channel = await open_channel(BulkPeer(SERVER.peer_id, "127.0.0.1", port), CLIENT)
                    await request(channel, OP_RANGE, bytes(32), 0, 1 << 20)
                    with pytest.raises(BulkError, match=message):
                        await response(channel, 1 << 20)
                nursery.cancel_scope.cancel()

    trio.run(main)


def test_token_bucket_paces_on_the_trio_clock():
    async def main():
        bucket = TokenBucket(rate=1000.0, burst=500)
        start = trio.current_time()
        await bucket.take(500)  # the initial burst is free
        assert trio.current_time() == start
        await bucket.take(500)
        assert trio.current_time() - start == pytest.approx(0.5)
        await bucket.take(2000)  # larger than the burst: waits for a full burst, then owes the rest
        await bucket.take(1)
        assert trio.current_time() - start == pytest.approx(0.5 + 0.5 + 1.5 + 0.001)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_peer_learns_the_bulk_address_over_libp2p():
    async def main():
        with trio.fail_after(30):
            async with open_p2p(SERVER, "127.0.0.1", 0) as a, open_p2p(CLIENT, "127.0.0.1", 0) as b:
                a.set_stream_handler(ADDRESS_PROTOCOL, address_handler(4242))
                await b.connect(a.addrs[0])
                assert await find_bulk_peer(b, a.peer_id) == BulkPeer(SERVER.peer_id, "127.0.0.1", 4242)
                assert await find_bulk_peer(a, b.peer_id) is None  # b has no bulk listener

    trio.run(main)


def test_bulk_ports_are_asked_once_and_reused_until_they_expire(monkeypatch):
    """node/runs.py: every checkpoint fetch needs its candidates' bulk ports; a port learned over
    libp2p is reused for BULK_PORT_TTL_S, then asked again (a restarted peer may have a new one)."""
    from open1b.node import runs
    from open1b.node.bulk import ADDRESS_PROTOCOL, address_handler

    asked = []

    async def main():
        async with open_p2p(ident(80), "127.0.0.1", 0) as a, open_p2p(ident(81), "127.0.0.1", 0) as b:
            answer = address_handler(4242)

            async def counting(stream):
                asked.append(stream.peer_id)
                await answer(stream)

            a.set_stream_handler(ADDRESS_PROTOCOL, counting)
            await b.connect(a.addrs[0])
            ports = runs._BulkPorts(None)
            for _ in range(3):
                peers = await ports.of(b, [a.peer_id])
                assert [(p.peer_id, p.host, p.port) for p in peers] == [(a.peer_id, "127.0.0.1", 4242)]
            assert len(asked) == 1
            monkeypatch.setattr(runs, "BULK_PORT_TTL_S", 0.0)  # kept for no time: asked again, every time
            ports = runs._BulkPorts(None)
            await ports.of(b, [a.peer_id])
            await ports.of(b, [a.peer_id])
            assert len(asked) == 3

    trio.run(main)


def test_idle_connections_from_one_address_do_not_shut_the_port(tmp_path):
    """200 TCP connections from 127.0.0.2 that never say a word once held all 32 session slots, and
    every real handshake was refused until they left. Now that address gets a few handshake slots,
    the rest are closed at once, the few after FIRST_BYTES_TIMEOUT_S, and a client elsewhere
    (127.0.0.1) is served meanwhile."""
    (tmp_path / "blob").write_bytes(b"x" * 100)
    cache = BlobCache(tmp_path / "cache", 1 << 20)
    digest = cache.add_file(tmp_path / "blob")

    async def main():
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                port = await nursery.start(serve_bulk, cache, SERVER, "127.0.0.1", 0)
                idle = []
                for _ in range(200):
                    sock = trio.socket.socket()
                    await sock.bind(("127.0.0.2", 0))
                    await sock.connect(("127.0.0.1", port))
                    idle.append(sock)
                channel = await open_channel(BulkPeer(SERVER.peer_id, "127.0.0.1", port), CLIENT)
                await request(channel, OP_RANGE, digest, 0, 100)
                assert await response(channel, 100) == (0, 100, bytearray(b"x" * 100))
                closed = 0
                for sock in idle:  # each is closed by the server: at once, or after the first-bytes timeout
                    assert await sock.recv(1) == b""
                    closed += 1
                    sock.close()
                assert closed == 200
                nursery.cancel_scope.cancel()

    trio.run(main)


def test_an_address_has_a_few_handshake_slots_at_a_time(tmp_path):
    async def main():
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                port = await nursery.start(serve_bulk, BlobCache(tmp_path, 1 << 20), SERVER, "127.0.0.1", 0)
                socks = []
                for _ in range(MAX_HANDSHAKES_PER_IP + 3):
                    sock = trio.socket.socket()
                    await sock.bind(("127.0.0.3", 0))
                    await sock.connect(("127.0.0.1", port))
                    socks.append(sock)
                started = trio.current_time()
                for sock in socks[MAX_HANDSHAKES_PER_IP:]:  # refused at once
                    assert await sock.recv(1) == b""
                refused_after = trio.current_time() - started
                for sock in socks[:MAX_HANDSHAKES_PER_IP]:  # dropped for silence, well before the handshake's bound
                    assert await sock.recv(1) == b""
                assert refused_after < trio.current_time() - started < HANDSHAKE_TIMEOUT_S
                for sock in socks:
                    sock.close()
                nursery.cancel_scope.cancel()

    trio.run(main)


class _NoAddressPeers:
    """A P2P whose peers have no address we can dial (behind NAT), connected ``kind``, and our own
    ``reachability``."""

    def __init__(self, kind: str, reachability: str = "public") -> None:
        self.relays = type("Relays", (), {"kind": staticmethod(lambda peer: kind)})()
        self.reachability = reachability

    def peer_addrs(self, peer_id: str) -> list[str]:
        return [f"/ip4/11.240.0.1/tcp/4701/p2p/{SERVER.peer_id}/p2p-circuit/p2p/{peer_id}"]


def test_a_provider_behind_nat_is_dialled_back_over_a_direct_connection_and_never_through_a_relay(tmp_path, caplog):
    server = BulkServer(BlobCache(tmp_path, 1 << 20), CLIENT)

    async def main():
        direct = await find_bulk_peer(_NoAddressPeers("direct"), OTHER.peer_id, server)
        assert isinstance(direct, DialBackPeer) and direct.peer_id == OTHER.peer_id
        assert await find_bulk_peer(_NoAddressPeers("direct"), OTHER.peer_id) is None  # no listener to be dialled at
        with caplog.at_level(logging.INFO, logger="open1b.node.bulk"):
            assert await find_bulk_peer(_NoAddressPeers("relayed"), OTHER.peer_id, server) is None
            # we are behind NAT too (a hole punch made the connection direct): its dial would not reach us
            assert await find_bulk_peer(_NoAddressPeers("direct", "private"), OTHER.peer_id, server) is None
        refusals = [r.getMessage() for r in caplog.records if "no bulk session" in r.getMessage()]
        assert len(refusals) == 2 and "checkpoints never cross one" in refusals[0], refusals
        assert "both behind NAT" in refusals[1], refusals

    trio.run(main)



async def _ask_dial_back(asker, provider, port: int, request: bytes | None = None):
    """``asker`` asks ``provider`` to dial it back at ``port`` (or sends ``request``): the answer,
    or None if the stream was reset (refused)."""
    stream = await asker.open_stream(provider.peer_id, DIALBACK_PROTOCOL)
    try:
        await stream.send(request if request is not None else encode({"port": port, "token": bytes(32)}))
        return decode(bytes(await stream.receive(64)), max_size=64)
    except NetworkError:
        return None


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dial_backs_to_one_address_are_bounded_whatever_the_keys_and_a_failed_one_pauses_it(tmp_path):
    """A dial-back goes only to the address the asker's connection comes from, but the port is
    the asker's word: fresh keys from one address made the provider hold connections to a port
    there (2 per key: N keys, 2N connections, each held for the handshake timeout), and one key
    scanned that address's ports as fast as it asked (each answered dialled or not). Now one
    address has MAX_DIALBACKS_PER_HOST at a time whatever the keys, a dial that fails pauses
    dial-backs to that address for DIALBACK_PAUSE_S, and a malformed request penalises its sender."""
    keys = [ident(70 + i) for i in range(3)]
    penalised = []

    async def main():
        with trio.fail_after(60):
            async with AsyncExitStack() as stack:
                nursery = await stack.enter_async_context(trio.open_nursery())
                provider = await stack.enter_async_context(open_p2p(SERVER, "127.0.0.1", 0))
                server = BulkServer(BlobCache(tmp_path, 1 << 20), SERVER, penalise=penalised.append)
                await nursery.start(server.serve, "127.0.0.1", 0)
                provider.set_stream_handler(DIALBACK_PROTOCOL, server.dial_back)
                askers = await connected_to(stack, provider, keys)
                held, release = [], trio.Event()

                async def hold(stream):  # the port the askers name: it accepts and never speaks
                    held.append(stream)
                    await release.wait()

                port = await tcp_listener(nursery, hold)
                # each key its own bound of 2
                answers = await at_once(lambda asker: _ask_dial_back(asker, provider, port), askers * 2)
                dialled = [a for a in answers if a is not None and a["dialled"]]
                assert 1 <= len(dialled) <= MAX_DIALBACKS_PER_HOST and len(held) <= MAX_DIALBACKS_PER_HOST, answers
                release.set()

                scan = [await _ask_dial_back(askers[0], provider, _closed_port()) for _ in range(4)]
                assert sum(a is not None for a in scan) <= 1, scan  # was 4 × {"dialled": False}
                assert await _ask_dial_back(askers[1], provider, 0, b"\xff" * 8) is None  # not CBOR
                assert await _ask_dial_back(askers[2], provider, 0, encode({"port": port, "token": b"x"})) is None
                assert penalised == [keys[1].peer_id, keys[2].peer_id]
                nursery.cancel_scope.cancel()

    trio.run(main)
