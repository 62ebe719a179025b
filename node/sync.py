"""The sync stream protocol ``/open1b/sync/1.0.0``: pull a peer's attestations of one run.

Frames are varint-length-prefixed. Request: one frame, canonical CBOR ``{"run": <32 bytes>}``
(≤ 256 bytes). Response: up to :data:`MAX_SYNC_STATEMENTS` frames, each one encoded attestation
(≤ MAX_ATTESTATION_SIZE), then an empty frame. The puller validates every frame exactly like a
gossiped one, so a lying peer can waste our time but never put anything unchecked in the store.
"""

from __future__ import annotations

from typing import Callable

from open1b.protocol import Attestation
from open1b.protocol.codec import decode, encode
from open1b.protocol.errors import WrongTypeError
from open1b.protocol.messages import MAX_ATTESTATION_SIZE

from .p2p import P2P, Stream

SYNC_PROTOCOL = "/open1b/sync/1.0.0"
MAX_SYNC_REQUEST = 256
MAX_SYNC_STATEMENTS = 100_000


async def serve_sync(stream: Stream, attestations_of: Callable[[bytes], list[Attestation] | None]) -> None:
    request = decode(await stream.receive(MAX_SYNC_REQUEST), max_size=MAX_SYNC_REQUEST)
    if type(request) is not dict or set(request) != {"run"} or type(request["run"]) is not bytes:
        raise WrongTypeError("malformed sync request")
    for att in (attestations_of(request["run"]) or [])[:MAX_SYNC_STATEMENTS]:
        await stream.send(att.encoded)
    await stream.send(b"")
    await stream.close()


async def pull_attestations(p2p: P2P, peer_id: str, run: bytes, ingest: Callable[[bytes], bool]) -> int:
    """Ask ``peer_id`` for its attestations of ``run``; returns how many ``ingest`` found new."""
    stream = await p2p.open_stream(peer_id, SYNC_PROTOCOL)
    new = 0
    try:
        await stream.send(encode({"run": run}))
        for _ in range(MAX_SYNC_STATEMENTS):
            frame = await stream.receive(MAX_ATTESTATION_SIZE)
            if not frame:
                break
            new += ingest(frame)
    finally:
        await stream.close()
    return new
