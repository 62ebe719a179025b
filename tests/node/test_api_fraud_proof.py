"""``GET /v1/disputes/{run}/{digest}`` over the real API server (node/api_routes.py behind its
guard, served by Hypercorn in this process): a stored fraud proof's bytes, read from the store a
piece at a time, are the stored bytes with the headers a whole response had, and the server holds
a piece of a large body, not the body."""

from __future__ import annotations

import http.client
import os
import socket
import tracemalloc

import pytest
import trio

from open1b.node.api import serve_api
from open1b.node.api_routes import Components, api_app
from open1b.node.clock import Clock
from open1b.node.config import NodeConfig
from open1b.node.fraud_proofs import ProvenFraud
from open1b.node.p2p import FRAME_PIECE
from open1b.protocol import Identity
from open1b.protocol.hashing import blake2b256
from tests.runs import run_manifest

from .fakes import make_ledger

GUILTY = b"\x02" * 32
MANIFEST = run_manifest(Identity(b"\x01" * 32), engine="test-engine", engine_version="1", model={"d": 2}, data={},
                        seed=0, steps=5, state_hashes=[blake2b256(b"h", bytes([k])) for k in range(6)], created_at=1_800_000_000)


def _served(tmp_path, body: bytes):
    """The API of a node whose store keeps ``body`` as a proof of MANIFEST's run (the store keeps
    what it is given; no referee reads it here), and the proof's path."""
    ledger = make_ledger(tmp_path, MANIFEST)
    digest = blake2b256(body)
    assert ledger.store.fraud.add(ProvenFraud(MANIFEST.run_id, 3, "matmul", 7, (GUILTY,), b"\x03" * 32,
                                              (b"\x04" * 32,), digest, len(body), encoded=body))
    node = Components(identity=None, config=NodeConfig(data_dir=tmp_path), clock=Clock(), p2p=None, ledger=ledger,
                      publisher=None, fetcher=None, runfiles=None, stats=None, worker=None, shutdown=trio.Event(),
                      evaluator=None, reachability=None)  # what the disputes' routes do not read
    return api_app(node, token="ab" * 32), ledger.store, f"/v1/disputes/{MANIFEST.run_id.hex()}/{digest.hex()}"


def _get(port: int, path: str, read, *, receive_buffer: int | None = None):
    """(status, headers, what ``read(response)`` returns) of a GET on the API; ``receive_buffer``:
    the client socket's, so that the server cannot send far ahead of what the client read."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    if receive_buffer is not None:
        conn.sock = socket.socket()
        conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        conn.sock.connect(("127.0.0.1", port))
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, read(response)
    finally:
        conn.close()


def _in_pieces(response) -> tuple[bytes, int]:
    """The body's digest and length, read 64 KiB at a time (the client holds no copy of it)."""
    digest, size = b"", 0
    while piece := response.read(65536):
        digest, size = blake2b256(digest, piece), size + len(piece)
    return digest, size


def _digest_of_pieces(body: bytes) -> bytes:
    digest = b""
    for offset in range(0, len(body), 65536):
        digest = blake2b256(digest, body[offset:offset + 65536])
    return digest


async def _serving(app, client):
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_api, "127.0.0.1", 0, app)
        try:
            return await trio.to_thread.run_sync(client, port)
        finally:
            nursery.cancel_scope.cancel()


def test_a_multi_mib_proof_is_the_stored_bytes_with_the_headers_of_a_whole_response(tmp_path):
    body = os.urandom((6 << 20) + 12345)  # pieces of FRAME_PIECE, the last not a whole one
    app, _, path = _served(tmp_path, body)
    status, headers, got = trio.run(_serving, app, lambda port: _get(port, path, lambda r: r.read()))
    assert status == 200 and got == body
    assert headers["content-type"] == "application/cbor" and headers["content-length"] == str(len(body))
    assert "transfer-encoding" not in headers  # a body of the length announced, as Response(body) sent it
    missing = path[:-64] + "00" * 32
    status, _, answer = trio.run(_serving, app, lambda port: _get(port, missing, lambda r: r.read()))
    assert status == 404 and b"no such fraud proof" in answer


def test_the_server_holds_a_piece_of_a_large_proof_not_the_proof(tmp_path):
    body = os.urandom(24 << 20)
    app, _, path = _served(tmp_path, body)
    tracemalloc.start()
    try:
        status, _, (digest, size) = trio.run(_serving, app, lambda port: _get(port, path, _in_pieces))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert status == 200 and size == len(body) and digest == _digest_of_pieces(body)
    assert peak < 8 * FRAME_PIECE, peak  # ~1.0 MiB measured, both ends; 25.4 MiB when it was read whole


def test_a_proof_dropped_while_it_is_sent_cuts_the_response_short(tmp_path):
    body = os.urandom(64 * FRAME_PIECE)
    app, store, path = _served(tmp_path, body)

    def drop_after_a_piece(response) -> bytes:
        got = response.read(FRAME_PIECE)
        trio.from_thread.run_sync(store._db.execute, "DELETE FROM fraud_proof_bodies")  # as the run's bound drops it
        with pytest.raises(http.client.IncompleteRead):
            response.read()
        return got

    # the server is then at most its send buffer (≤ 4 MiB by default) ahead of the client, far from the end
    status, headers, got = trio.run(_serving, app, lambda port: _get(port, path, drop_after_a_piece,
                                                                     receive_buffer=1 << 16))
    assert status == 200 and got == body[:FRAME_PIECE] and headers["content-length"] == str(len(body))
