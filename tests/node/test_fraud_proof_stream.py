"""A fraud proof's body on the stream ``/open1b/fraudproof/1.0.0`` (docs/protocol.md §18.7), over
real libp2p hosts on loopback: served from the store and fetched to a file a piece at a time
(node/fraud_proof_fetch.py), as the same bytes on the wire as one frame written or read whole, so
that a node holds a few hundred KiB of a body up to 128 MiB, not the body (nor two copies of it)."""

from __future__ import annotations

import io
import os
import tracemalloc
from contextlib import AsyncExitStack

import pytest
import trio

import open1b.node.fraud_proof_fetch as fraud_proof_fetch
from open1b.node.clock import Clock
from open1b.node.fraud_proof_fetch import FRAUD_PROOF_PROTOCOL, ProofFetcher, fetch_fraud_proof, serve_fraud_proof
from open1b.node.fraud_proof_refs import FraudProofRef
from open1b.node.fraud_proof_store import BodyDropped
from open1b.node.fraud_proofs import ProvenFraud
from open1b.node.p2p import FRAME_PIECE, NetworkError
from open1b.node.store import Store
from open1b.protocol.codec import encode
from open1b.protocol.errors import InvalidStatementError
from open1b.protocol.hashing import blake2b256

from .fakes import make_ledger
from .loopback_hosts import connected_pair

RUN, GUILTY = b"\x01" * 32, b"\x02" * 32


def _stored(tmp_path, body: bytes) -> tuple[Store, FraudProofRef]:
    """A store holding ``body`` as a proof (the store keeps what it is given: a verdict's fields
    and bytes; no referee reads it here), and the reference naming it."""
    store = Store(tmp_path / "store.sqlite")
    digest = blake2b256(body)
    assert store.fraud.add(ProvenFraud(RUN, 3, "matmul", 7, (GUILTY,), b"\x03" * 32, (b"\x04" * 32,), digest,
                                       len(body), encoded=body))
    return store, FraudProofRef(RUN, 3, digest, len(body), (GUILTY,))


async def _serving(stack: AsyncExitStack, store: Store):
    """A server (as ProofFetcher serves) and a client connected to it: (client, server's peer ID)."""
    server, client = await connected_pair(stack, 60)
    server.set_stream_handler(FRAUD_PROOF_PROTOCOL, lambda stream: serve_fraud_proof(stream, store.fraud.open_body))
    return client, server.peer_id


async def _ask(client, peer: str, ref: FraudProofRef):
    stream = await client.open_stream(peer, FRAUD_PROOF_PROTOCOL)
    await stream.send(encode({"run": ref.run, "digest": ref.digest}))
    return stream


def test_a_body_served_in_pieces_is_one_frame_of_the_same_bytes_read_whole_or_in_pieces(tmp_path):
    body = os.urandom(3 * FRAME_PIECE + 12345)  # a last piece that is not a whole one
    store, ref = _stored(tmp_path, body)

    async def main():
        with trio.fail_after(60):
            async with AsyncExitStack() as stack:
                client, peer = await _serving(stack, store)
                stream = await _ask(client, peer, ref)  # a peer that reads the frame whole (before pieces)
                assert await stream.receive(len(body)) == body
                await stream.close()
                pieces: list[bytes] = []
                stream = await _ask(client, peer, ref)
                assert await stream.receive_pieces(len(body), pieces.append) == len(body)
                await stream.close()
                assert b"".join(pieces) == body and max(map(len, pieces)) <= FRAME_PIECE
                spool = io.BytesIO()
                assert await fetch_fraud_proof(client, peer, ref, spool) is True
                assert spool.getvalue() == body
                unknown = FraudProofRef(RUN, 3, b"\x05" * 32, len(body), (GUILTY,))
                assert await fetch_fraud_proof(client, peer, unknown, io.BytesIO()) is False  # an empty frame
                # a body over the size announced is refused before a byte of it is read
                short = FraudProofRef(RUN, 3, ref.digest, len(body) - 1, (GUILTY,))
                spool = io.BytesIO()
                with pytest.raises(InvalidStatementError) as raised:
                    await fetch_fraud_proof(client, peer, short, spool)
                assert raised.value.code == "ref_body" and spool.getvalue() == b""

    trio.run(main)


def test_serving_and_fetching_a_large_body_hold_a_few_mib_not_the_body(tmp_path):
    size = 64 << 20
    store, ref = _stored(tmp_path, os.urandom(size))  # the bytes live in the store only

    async def main():
        with trio.fail_after(120):
            async with AsyncExitStack() as stack:
                client, peer = await _serving(stack, store)
                with (tmp_path / "spool").open("w+b") as spool:
                    tracemalloc.start()
                    try:
                        assert await fetch_fraud_proof(client, peer, ref, spool) is True  # its digest checked
                        _, peak = tracemalloc.get_traced_memory()
                    finally:
                        tracemalloc.stop()
                    assert spool.tell() == size
        # both ends in this process: ~1.3 MiB measured; whole frames held ~3 copies (194 MiB); 16 MiB
        # is the most yamux buffers for one stream (its receive window), were the reader ever slow
        assert peak < 20 << 20, peak

    trio.run(main)


def test_a_body_dropped_while_it_is_served_cuts_the_frame_short_and_blames_no_one(tmp_path):
    body = os.urandom(16 * FRAME_PIECE)
    store, ref = _stored(tmp_path, body)
    with store.fraud.open_body(RUN, ref.digest) as stored:
        assert stored.read(FRAME_PIECE, 10) == body[FRAME_PIECE:FRAME_PIECE + 10]
        store._db.execute("DELETE FROM fraud_proof_bodies")  # as the run's bound or a lower digest drops it
        with pytest.raises(BodyDropped):
            stored.read(2 * FRAME_PIECE, 10)
    with store.fraud.open_body(RUN, ref.digest) as stored:
        assert stored is None

    (tmp_path / "again").mkdir()
    store, ref = _stored(tmp_path / "again", body)  # the server's yamux window (256 KiB) holds the rest back
    dropped = trio.Event()

    async def main():
        with trio.fail_after(60):
            async with AsyncExitStack() as stack:
                client, peer = await _serving(stack, store)
                stream = await _ask(client, peer, ref)

                def first_piece(piece: bytes) -> None:
                    if not dropped.is_set():
                        store._db.execute("DELETE FROM fraud_proof_bodies")
                        dropped.set()

                with pytest.raises(NetworkError):  # the server resets the stream: a failed fetch, not a lie
                    await stream.receive_pieces(len(body), first_piece)
                assert client.rejected == {}

    trio.run(main)


def test_a_peer_that_stops_reading_holds_its_serving_slot_no_longer_than_a_fetch_may_take(tmp_path, monkeypatch):
    monkeypatch.setattr(fraud_proof_fetch, "FETCH_TIMEOUT_S", 0.5)
    body = os.urandom(16 * FRAME_PIECE)  # more than the yamux window lets through unread (256 KiB)
    served = trio.Event()

    async def main():
        with trio.fail_after(60):
            async with AsyncExitStack() as stack:
                server, client = await connected_pair(stack, 62)
                ledger = make_ledger(tmp_path, clock=Clock(), gossip=server)
                ref = FraudProofRef(RUN, 3, blake2b256(body), len(body), (GUILTY,))
                assert ledger.store.fraud.add(ProvenFraud(RUN, 3, "matmul", 7, (GUILTY,), b"\x03" * 32,
                                                          (b"\x04" * 32,), ref.digest, len(body), encoded=body))
                fetcher = ProofFetcher(server, ledger.statements, ledger.outbox.regossip, tmp_path / "spool")

                async def serve(stream):
                    await fetcher._serve(stream)
                    served.set()

                server.set_stream_handler(FRAUD_PROOF_PROTOCOL, serve)
                stream = await _ask(client, server.peer_id, ref)
                await served.wait()  # the server gave up on a peer that reads nothing
                assert fetcher._serving == set()
                with pytest.raises(NetworkError):  # reset: what came before it is not the body
                    await stream.receive_pieces(len(body), lambda piece: None)

    trio.run(main)


def test_the_spool_directory_is_emptied_at_start_and_a_failing_disk_is_a_failed_fetch_blaming_no_one(tmp_path):
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir()
    (spool_dir / "tmpleftover").write_bytes(b"a crash's half body")
    ledger = make_ledger(tmp_path, clock=Clock())
    peer = "12D3KooWpeer"
    fetcher = ProofFetcher(_Host(), ledger.statements, ledger.outbox.regossip, spool_dir)
    assert list(spool_dir.iterdir()) == []
    spool_dir.rmdir()  # the disk fails the spool file
    trio.run(fetcher.fetch, FraudProofRef(RUN, 3, b"\x05" * 32, 2 << 20, (GUILTY,)), peer)
    assert fetcher.fetched == {"failed": 1} and fetcher.p2p.penalised == []


class _Host:
    """What ProofFetcher needs of a host when nothing reaches the network."""

    peer_id = "me"

    def __init__(self) -> None:
        self.penalised: list[str] = []

    def set_stream_handler(self, protocol, handler) -> None:
        pass

    def penalise(self, peer: str) -> None:
        self.penalised.append(peer)
