"""The sync stream protocol ``/open1b/sync/1.0.0``: pull a peer's attestations (and witness
reveals) of one run.

Frames are varint-length-prefixed. Request: one frame, canonical CBOR ``{"run": <32 bytes>}``
(≤ 256 bytes). Response: up to :data:`MAX_SYNC_STATEMENTS` frames, each one encoded attestation
or witness reveal (≤ MAX_ATTESTATION_SIZE), then an empty frame. The puller validates every frame exactly like a
gossiped one, so a lying peer can waste our time but never put anything unchecked in the store.

A second protocol, ``/open1b/sync/runs/1.0.0`` (below), lets a node learn the run manifests it
missed on the runs topic (docs/protocol.md §11.3).
"""

from __future__ import annotations

from typing import Awaitable, Callable

from open1b.protocol import SignedMessage
from open1b.protocol.codec import decode, encode
from open1b.protocol.errors import WrongTypeError
from open1b.protocol.messages import MAX_ATTESTATION_SIZE, MAX_MANIFEST_SIZE

from .p2p import P2P, Stream

SYNC_PROTOCOL = "/open1b/sync/1.0.0"
MAX_SYNC_REQUEST = 256
MAX_SYNC_STATEMENTS = 100_000


async def serve_sync(stream: Stream, attestations_of: Callable[[bytes], list[SignedMessage] | None]) -> None:
    request = decode(await stream.receive(MAX_SYNC_REQUEST), max_size=MAX_SYNC_REQUEST)
    if type(request) is not dict or set(request) != {"run"} or type(request["run"]) is not bytes:
        raise WrongTypeError("malformed sync request")
    for att in (attestations_of(request["run"]) or [])[:MAX_SYNC_STATEMENTS]:
        await stream.send(att.encoded)
    await stream.send(b"")
    await stream.close()


async def pull_attestations(p2p: P2P, peer_id: str, run: bytes, ingest: Callable[[bytes], bool]) -> int:
    """Ask ``peer_id`` for its statements of ``run``; returns how many ``ingest`` found new. A frame
    may hold either kind (a reveal is smaller than MAX_ATTESTATION_SIZE): ``ingest`` tells them apart."""
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


# -- manifests ---------------------------------------------------------------------------------
# ``/open1b/sync/runs/1.0.0``: a late joiner (or a node back from a restart or a partition) learns
# the runs it missed on the runs topic. On one stream: the puller sends ``{"runs": true}``; the
# server answers one frame, the canonical CBOR list of the run ids it knows (≤ MAX_SYNC_RUNS);
# the puller sends ``{"want": [ids]}`` (≤ MAX_SYNC_WANT of them, each from that list); the server
# answers one frame per wanted id, in order: the encoded manifest, or an empty frame if it has
# none. Every manifest is validated exactly like a gossiped one.

RUNS_SYNC_PROTOCOL = "/open1b/sync/runs/1.0.0"
MAX_SYNC_RUNS = 1024
MAX_SYNC_WANT = 16
MAX_RUNS_REQUEST = 64 + MAX_SYNC_WANT * 34
MAX_RUN_LIST = 16 + MAX_SYNC_RUNS * 34


async def serve_runs(stream: Stream, run_ids: Callable[[], list[bytes]],
                     manifest_of: Callable[[bytes], bytes | None]) -> None:
    request = decode(await stream.receive(MAX_RUNS_REQUEST), max_size=MAX_RUNS_REQUEST)
    if request != {"runs": True}:
        raise WrongTypeError("malformed runs sync request")
    known = run_ids()[:MAX_SYNC_RUNS]
    await stream.send(encode(known))
    request = decode(await stream.receive(MAX_RUNS_REQUEST), max_size=MAX_RUNS_REQUEST)
    if (type(request) is not dict or set(request) != {"want"} or type(request["want"]) is not list
            or len(request["want"]) > MAX_SYNC_WANT or not all(type(r) is bytes for r in request["want"])):
        raise WrongTypeError("malformed runs sync request")
    for run in request["want"]:
        await stream.send(manifest_of(run) or b"")
    await stream.close()


async def pull_manifests(p2p: P2P, peer_id: str, known: Callable[[bytes], bool],
                         ingest: Callable[[bytes], Awaitable[bool]]) -> int:
    """Ask ``peer_id`` for the runs it knows and fetch up to :data:`MAX_SYNC_WANT` manifests we
    lack; returns how many ``ingest`` found new. A malformed answer raises :class:`WrongTypeError`."""
    stream = await p2p.open_stream(peer_id, RUNS_SYNC_PROTOCOL)
    new = 0
    try:
        await stream.send(encode({"runs": True}))
        listed = decode(await stream.receive(MAX_RUN_LIST), max_size=MAX_RUN_LIST)
        if type(listed) is not list or len(listed) > MAX_SYNC_RUNS or not all(
                type(r) is bytes and len(r) == 32 for r in listed):
            raise WrongTypeError("malformed run list")
        want = [r for r in dict.fromkeys(listed) if not known(r)][:MAX_SYNC_WANT]
        await stream.send(encode({"want": want}))
        for _ in want:
            frame = await stream.receive(MAX_MANIFEST_SIZE)
            if frame:
                new += await ingest(frame)
    finally:
        await stream.close()
    return new
