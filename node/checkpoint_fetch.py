"""Fetch a checkpoint over the bulk path from several providers at once, checking every 1 MiB
chunk on arrival against the published h_k (docs/run-format.md §6.6).

1. Sessions are opened to every provider in parallel; one that cannot be reached, or does not
   prove its peer ID, is left out (not blamed).
2. From the first provider that holds the blob: the file's header, checked against the model's
   layout (:func:`.chunk_table.check_layout`), and its chunk table, checked against h_k
   (:meth:`.chunk_table.Expectation.check_table`). A provider whose header or table fails is left
   out, not blamed (see :class:`_Unproven`), and the next one is asked.
3. Chunks are handed out in file order to whichever session has room in its window (8 requests in
   flight), so a faster provider takes more of them. Each chunk is hashed on arrival and compared
   with its table entry; a provider that sends one wrong chunk is blamed and cut off at that chunk,
   and its unfinished chunks go back to the others. Verified chunks are written in place
   (``pwrite`` into ``<hex>.partial``, never the whole file in memory) and their indices appended to
   ``<hex>.pieces``, so a fetch that is interrupted — a crash, a cancel, every provider lost —
   resumes with the chunks it had.
4. The whole-file address is hashed as the verified prefix grows, and checked at the end. The
   chunks were all checked against h_k, so a mismatch can only be in the header: its provider is
   blamed (unless the header came from an earlier, interrupted fetch: then the file is fetched
   again from scratch, blaming no one).

Blame is for bytes that contradict what the publisher signed (h_k and the address), delivered on
a session whose every frame is tagged by the provider's authenticated key.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import trio

from open1b.protocol import Identity
from open1b.protocol.hashing import DIGEST_SIZE

from .blobs import BlobCache, BlobError, BlobMismatch
from .bulk import NOT_FOUND, OK, OP_RANGE, OP_TABLE, BulkError, BulkProvider, Channel, request, response
from .chunk_table import (
    HEADER_PREFIX,
    ChunkTableError,
    Expectation,
    Layout,
    check_layout,
    chunk_digest,
    fast_blake2b,
    header_length,
    parse_layout,
)
from .files import StorageFull, write_atomic

log = logging.getLogger(__name__)

WINDOW = 8
"""Chunk requests in flight per provider."""
CHECKERS = 2
"""Chunks of one session hashed at once (on a machine with more cores, one checker thread per
session would be the bound: ~1.4 ms per MiB for hashing and writing)."""
ADDRESS_HOLD_BYTES = 64 << 20
"""Verified chunks kept in memory until the whole-file hash reaches them (beyond: read back)."""
CHUNK_TIMEOUT_S = 30.0
TABLE_HASH_BYTES_PER_S = 100e6
"""The slowest rate at which a provider is expected to hash a checkpoint for its chunk table: it
may compute the table on the first request (a publisher warms them in the background, but a 1B
model's 11 GB checkpoint takes minutes on a loaded 2-core machine). The header-and-table answer
gets CHUNK_TIMEOUT_S plus that long; with 30 s flat, a 1B devnet's auditor gave up on the bulk
path and fetched the checkpoint over libp2p at a tenth of the speed."""
RECORD_MAGIC = b"open1b/pieces/v1"


class CheckpointFetchError(BlobError):
    """No provider delivered the checkpoint (the verified chunks so far are kept for a resume)."""


@dataclass
class FetchReport:
    path: Path
    size: int
    seconds: float
    first_verified_s: float | None  # from the call to the first chunk checked against h_k
    bytes_by_peer: dict[str, int] = field(default_factory=dict)
    resumed_pieces: int = 0
    blamed: list[str] = field(default_factory=list)
    dialled_back: list[str] = field(default_factory=list)  # providers whose session they dialled (behind NAT)


def _storage_full(exc: OSError, address: bytes) -> OSError | StorageFull:
    """ENOSPC as the node's "storage full" (our disk: no provider is blamed); other errors as they are."""
    if exc.errno != errno.ENOSPC:
        return exc
    return StorageFull(f"no space left for checkpoint blob {address.hex()[:16]}")


class _Assembly:
    """The partial file, its record of verified chunks and the running whole-file hash. Its
    methods run in worker threads; ``_lock`` orders the record and the hash."""

    def __init__(self, partial: Path, record: Path, address: bytes, layout: Layout, header: bytes, table: bytes,
                 wanted: frozenset[int] | None = None) -> None:
        """``wanted``: the indices (into ``layout.pieces()``) of the only chunks to fetch (a
        checkpoint held in part: the file stays sparse, and its address is never checked); None:
        every chunk."""
        self.address, self.partial, self.record = address, partial, record
        self.layout, self.table = layout, table
        self.pieces = layout.pieces()
        self.done = [wanted is not None and i not in wanted for i in range(len(self.pieces))]
        self._lock = threading.Lock()
        self._hash = fast_blake2b()
        self._cursor = 0  # pieces[:cursor] are in the hash
        self._held: dict[int, bytes] = {}
        self._held_bytes = 0
        self.resumed = 0
        self.verified_bytes = len(header)
        stamp = RECORD_MAGIC + hashlib.blake2b(header, digest_size=DIGEST_SIZE).digest()
        if wanted is not None:
            stamp += hashlib.blake2b(table, digest_size=DIGEST_SIZE).digest()
        kept = self._read_record(stamp)
        if not kept:
            self.partial.unlink(missing_ok=True)
        self._fd = self._record_fd = -1
        try:
            self._fd = os.open(self.partial, os.O_RDWR | os.O_CREAT, 0o600)
            # Allocate every block now: a disk too small fails here, before a byte is fetched,
            # not at some chunk halfway (a sparse ftruncate would promise room it does not have).
            if wanted is None:
                os.posix_fallocate(self._fd, 0, layout.size)
            else:  # holes where nothing is fetched: a spot check's few MiB of an 11 GB checkpoint
                os.ftruncate(self._fd, layout.size)
            os.pwrite(self._fd, header, 0)
            self._record_fd = os.open(self.record, os.O_WRONLY | os.O_CREAT | os.O_APPEND | (0 if kept else os.O_TRUNC),
                                      0o600)
            if not kept:
                os.write(self._record_fd, stamp)
        except OSError as exc:
            self.close()
            if exc.errno == errno.ENOSPC:
                self.discard()
            raise _storage_full(exc, self.address) from None
        self._hash.update(bytes(header))

    def _read_record(self, stamp: bytes) -> bool:
        """Mark the chunks an earlier fetch of the same file (same ``stamp``: the header's hash,
        and for a file held in part the table's too, since two runs' checkpoint k of one model
        have the same header) verified."""
        try:
            data = self.record.read_bytes() if self.partial.exists() else b""
        except OSError:
            return False
        if not data.startswith(stamp):
            return False
        for (index,) in struct.iter_unpack("<I", data[len(stamp):len(stamp) + (len(data) - len(stamp)) // 4 * 4]):
            if index < len(self.done) and not self.done[index]:
                self.done[index] = True
                self.resumed += 1
                self.verified_bytes += self.pieces[index].length
        return True

    def check_and_write(self, index: int, received: bytearray) -> bool:
        """Hash chunk ``index`` and, if it is the table's, write and record it. Thread-safe."""
        piece = self.pieces[index]
        slot = self.table[DIGEST_SIZE * piece.slot:DIGEST_SIZE * (piece.slot + 1)]
        data = bytes(received)
        if len(data) != piece.length or chunk_digest(piece.chunk, data) != slot:
            return False
        try:
            os.pwrite(self._fd, data, piece.offset)
            with self._lock:
                os.write(self._record_fd, struct.pack("<I", index))
        except OSError as exc:
            raise _storage_full(exc, self.address) from None
        with self._lock:
            self.done[index] = True
            self.verified_bytes += piece.length
            if self._held_bytes + len(data) <= ADDRESS_HOLD_BYTES:  # saves reading it back for the address
                self._held[index] = data
                self._held_bytes += len(data)
        return True

    def hash_front(self) -> bool:
        """Feed the whole-file hash with the verified pieces at its front (one thread calls this,
        beside the ones checking chunks: the two passes over the bytes run on two cores). A piece
        is hashed from memory when it was held, else read back from the page cache. True once
        every piece is in the hash."""
        while self._cursor < len(self.pieces) and self.done[self._cursor]:
            with self._lock:
                data = self._held.pop(self._cursor, None)
                self._held_bytes -= len(data) if data is not None else 0
            p = self.pieces[self._cursor]
            self._hash.update(data if data is not None else os.pread(self._fd, p.length, p.offset))
            self._cursor += 1
        return self._cursor == len(self.pieces)

    def finish(self) -> bytes:
        """The whole file's address, after making the file durable."""
        if not self.hash_front():
            raise AssertionError("finish() before every piece was verified")
        self.sync()
        return self._hash.digest()

    def sync(self) -> None:
        """Make the written chunks durable."""
        os.fdatasync(self._fd)

    def close(self) -> None:
        for fd in (self._fd, self._record_fd):
            if fd >= 0:
                os.close(fd)
        self._fd = self._record_fd = -1

    def discard(self) -> None:
        self.partial.unlink(missing_ok=True)
        self.record.unlink(missing_ok=True)


class _Schedule:
    """Which chunks are still wanted; sessions take them in file order and give back what they
    could not finish."""

    def __init__(self, assembly: _Assembly) -> None:
        self.pending = deque(i for i, done in enumerate(assembly.done) if not done)
        self.remaining = len(self.pending)
        self._changed = trio.Event()

    def take(self) -> int | None:
        return self.pending.popleft() if self.pending else None

    def give_back(self, indices) -> None:
        self.pending.extendleft(sorted(indices, reverse=True))
        self._notify()

    def finished_one(self) -> None:
        self.remaining -= 1
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_change(self) -> None:
        await self._changed.wait()


class _Blame(Exception):
    """The provider sent what contradicts the manifest (h_k, the address or the size bound)."""


class _Unproven(Exception):
    """The provider's header or chunk table does not prove the published h_k. Not blamed: an
    honest provider of a file that the publisher itself misdescribed (one whose bytes are not state
    h_k) sends exactly this, and such a file can reach honest nodes over the libp2p path, which
    checks the address alone. The provider is left out; the address check there judges it."""


class _ResumedMismatch(Exception):
    """A file partly resumed from an earlier fetch did not hash to its address: nobody to blame."""


async def _header_and_table(channel: Channel, expect: Expectation, timeout_s: float) -> tuple[bytes, Layout, bytes] | None:
    """The provider's header and chunk table, checked; None if it does not hold the blob.
    Raises :class:`_Blame` when what it sent contradicts the manifest, :class:`_Unproven` when its
    header or table does not prove h_k."""
    with trio.fail_after(timeout_s):
        await request(channel, OP_RANGE, expect.address, 0, HEADER_PREFIX)
        status, size, prefix = await response(channel, HEADER_PREFIX)
        if status == NOT_FOUND:
            return None
        if status != OK:
            raise BulkError(f"status {status} for the header")
        if not HEADER_PREFIX < size <= expect.max_size:
            raise _Blame(f"a size of {size} bytes for a checkpoint of at most {expect.max_size}")
        try:
            n = header_length(prefix)
            await request(channel, OP_RANGE, expect.address, HEADER_PREFIX, n)
            status, again, rest = await response(channel, n)
            if status != OK:
                raise BulkError(f"status {status} for the header")
            if again != size:
                raise _Blame(f"the blob's size changed from {size} to {again}")
            header = bytes(prefix + rest)
            layout = parse_layout(header, size)
            check_layout(layout, expect.shapes, expect.step)
            await request(channel, OP_TABLE, expect.address)
            status, again, table = await response(channel, layout.table_size)
            if status != OK:  # a refusal is not a lie about the blob's bytes
                raise BulkError(f"status {status} for the chunk table")
            if again != size:
                raise _Blame(f"the blob's size changed from {size} to {again}")
            expect.check_table(layout, bytes(table))
        except ChunkTableError as exc:
            raise _Unproven(str(exc)) from None
    return header, layout, bytes(table)


async def _run_session(channel: Channel, assembly: _Assembly, schedule: _Schedule, report: FetchReport,
                       started: float, window: int, timeout_s: float,
                       progress: Callable[[int, int], None]) -> None:
    """Fetch chunks on one session until none is left. One task requests and receives, others
    check and write (each in a thread), so hashing overlaps the network. Raises :class:`_Blame` at
    the first wrong chunk, or the transport's error, after giving back every chunk it took and
    did not finish."""
    taken: set[int] = set()  # requested, not yet verified
    send_received, receive_received = trio.open_memory_channel[tuple[int, bytearray]](2)
    failure: list[Exception] = []
    peer = channel.peer_id

    async def receive_loop(cancel: trio.CancelScope) -> None:
        in_flight: deque[int] = deque()
        try:
            async with send_received:
                while schedule.remaining:
                    while len(in_flight) < window and (index := schedule.take()) is not None:
                        in_flight.append(index)
                        taken.add(index)
                        piece = assembly.pieces[index]
                        await request(channel, OP_RANGE, assembly.address, piece.offset, piece.length)
                    if not in_flight:
                        await schedule.wait_change()
                        continue
                    with trio.fail_after(timeout_s):
                        status, size, data = await response(channel, assembly.pieces[in_flight[0]].length)
                    if status != OK:  # e.g. evicted meanwhile: it does not hold the blob, it did not lie
                        raise BulkError(f"status {status} for a chunk of the blob")
                    if size != assembly.layout.size:
                        raise _Blame(f"a blob of {size} bytes, not {assembly.layout.size}")
                    await send_received.send((in_flight.popleft(), data))
        except (_Blame, BulkError, trio.TooSlowError, trio.BrokenResourceError, OSError) as exc:
            failure.append(exc)
            cancel.cancel()

    async def check_loop(cancel: trio.CancelScope, received: trio.MemoryReceiveChannel) -> None:
        async for index, data in received:
            try:
                ok = await trio.to_thread.run_sync(assembly.check_and_write, index, data)
            except (StorageFull, OSError) as exc:  # our disk, not the provider's chunk
                failure.append(exc)
                cancel.cancel()
                return
            if not ok:
                failure.append(_Blame(f"chunk at byte {assembly.pieces[index].offset} does not match the chunk table"))
                cancel.cancel()
                return
            taken.discard(index)
            if report.first_verified_s is None:
                report.first_verified_s = time.perf_counter() - started
            report.bytes_by_peer[peer] = report.bytes_by_peer.get(peer, 0) + len(data)
            schedule.finished_one()
            progress(assembly.verified_bytes, assembly.layout.size)

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(receive_loop, nursery.cancel_scope)
            async with receive_received:
                for _ in range(CHECKERS):
                    nursery.start_soon(check_loop, nursery.cancel_scope, receive_received.clone())
    finally:
        schedule.give_back(i for i in taken if not assembly.done[i])
    if failure:
        raise failure[0]


async def fetch_checkpoint(cache: BlobCache, identity: Identity, peers: Sequence[BulkProvider], expect: Expectation, *,
                           on_bad_peer: Callable[[str], None] = lambda peer: None,
                           progress: Callable[[int, int], None] = lambda done, total: None,
                           window: int = WINDOW, chunk_timeout_s: float = CHUNK_TIMEOUT_S) -> FetchReport:
    """Checkpoint ``expect.step`` in ``cache``, fetched from ``peers`` over the bulk path, every
    chunk checked against h_k on arrival (module docstring). Raises :class:`CheckpointFetchError`
    when no provider delivers it; providers caught lying are passed to ``on_bad_peer``."""
    started = time.perf_counter()
    done = cache.open_blob(expect.address)
    if done is not None:
        return FetchReport(done, done.stat().st_size, 0.0, None)
    args = cache, identity, peers, expect, on_bad_peer, progress, window, chunk_timeout_s, started
    try:
        return await _fetch_once(*args)
    except _ResumedMismatch:  # the partial file is gone: this second fetch starts from scratch
        log.info("checkpoint %d: resumed file did not hash to its address; fetching again", expect.step)
        return await _fetch_once(*args)


class _Sessions:
    """Authenticated sessions to a checkpoint's providers, the first one's header and chunk table
    (checked against h_k), and the blame and errors of one fetch."""

    def __init__(self, expect: Expectation, report: FetchReport, on_bad_peer: Callable[[str], None]) -> None:
        self.expect, self.report, self.on_bad_peer = expect, report, on_bad_peer
        self.errors: list[str] = []
        self.open: list[Channel] = []
        self.header_peer = ""

    def blame(self, peer: str, reason: str) -> None:
        log.warning("checkpoint %d: provider %s lied (%s); cut off", self.expect.step, peer, reason)
        self.errors.append(f"{peer}: {reason}")
        self.report.blamed.append(peer)
        self.on_bad_peer(peer)

    async def dial_and_prove(self, identity: Identity, peers: Sequence[BulkProvider],
                             timeout_s: float) -> tuple[bytes, Layout, bytes]:
        """Open a session to every provider at once; then, from the first that holds the blob,
        its header and chunk table, checked."""
        channels: dict[str, Channel] = {}

        async def dial(peer: BulkProvider) -> None:
            try:
                channels[peer.peer_id] = await peer.open(identity)
            except BulkError as exc:
                self.errors.append(f"{peer.peer_id}: {exc}")

        async with trio.open_nursery() as nursery:
            for peer in dict((p.peer_id, p) for p in peers).values():
                nursery.start_soon(dial, peer)
        self.open = [channels[p.peer_id] for p in peers if p.peer_id in channels]
        self.report.dialled_back = sorted(c.peer_id for c in self.open if c.dialled_back)
        table_timeout_s = timeout_s + self.expect.max_size / TABLE_HASH_BYTES_PER_S
        for channel in list(self.open):
            first = None
            try:
                first = await _header_and_table(channel, self.expect, table_timeout_s)
            except _Blame as exc:
                self.blame(channel.peer_id, str(exc))
            except trio.TooSlowError:
                self.errors.append(f"{channel.peer_id}: no header and table in {table_timeout_s:.0f} s")
            except (_Unproven, BulkError) as exc:
                self.errors.append(f"{channel.peer_id}: {exc}")
            if first is not None:
                self.header_peer = channel.peer_id
                return first
            self.open.remove(channel)
            await channel.aclose()
        raise CheckpointFetchError(f"checkpoint {self.expect.step}: no provider delivered its header and chunk table: "
                                   + ("; ".join(self.errors) or "no provider"))

    async def fetch(self, assembly: _Assembly, started: float, window: int, timeout_s: float,
                    progress: Callable[[int, int], None], *, hash_address: bool) -> None:
        """Every chunk ``assembly`` still wants, over every open session at once (a provider that
        sends a wrong chunk is blamed and cut off; the others take its chunks); with
        ``hash_address``, the whole-file hash follows the verified front meanwhile."""
        schedule = _Schedule(assembly)
        full: list[StorageFull] = []

        async def session(channel: Channel) -> None:
            try:
                await _run_session(channel, assembly, schedule, self.report, started, window, timeout_s, progress)
            except StorageFull as exc:  # no session can write: stop them all, blame no one
                full.append(exc)
                sessions.cancel_scope.cancel()
            except _Blame as exc:
                self.blame(channel.peer_id, str(exc))
            except (BulkError, trio.TooSlowError, trio.BrokenResourceError, OSError) as exc:
                self.errors.append(f"{channel.peer_id}: {exc}")
            finally:
                self.open.remove(channel)
                await trio.aclose_forcefully(channel.stream)

        async def follow_front() -> None:
            while not await trio.to_thread.run_sync(assembly.hash_front):
                await schedule.wait_change()

        async with trio.open_nursery() as nursery:
            if hash_address:
                nursery.start_soon(follow_front)
            async with trio.open_nursery() as sessions:
                for channel in list(self.open):
                    sessions.start_soon(session, channel)
            nursery.cancel_scope.cancel()  # finish() hashes whatever is left
        if full:
            assembly.close()
            assembly.discard()  # as the libp2p path: no partial file survives a full disk
            raise full[0]
        if schedule.remaining:
            raise CheckpointFetchError(f"checkpoint {self.expect.step}: {schedule.remaining} chunks missing; "
                                       + "; ".join(self.errors))

    async def aclose(self) -> None:
        for channel in self.open:
            await trio.aclose_forcefully(channel.stream)


async def _fetch_once(cache: BlobCache, identity: Identity, peers: Sequence[BulkProvider], expect: Expectation,
                      on_bad_peer: Callable[[str], None], progress: Callable[[int, int], None], window: int,
                      timeout_s: float, started: float) -> FetchReport:
    report = FetchReport(cache.path(expect.address), 0, 0.0, None)
    sessions = _Sessions(expect, report, on_bad_peer)
    try:
        header, layout, table = await sessions.dial_and_prove(identity, peers, timeout_s)
        partial = cache.path(expect.address).with_suffix(".partial")
        # Free space against the announced (and h_k-checked) size, less the blocks a resumed file holds.
        cache.room(max(0, layout.size - (partial.stat().st_blocks * 512 if partial.exists() else 0)))
        assembly = await trio.to_thread.run_sync(_Assembly, partial, partial.with_suffix(".pieces"), expect.address,
                                                 layout, header, table)
        try:
            report.resumed_pieces = assembly.resumed
            await sessions.fetch(assembly, started, window, timeout_s, progress, hash_address=True)
            address = await trio.to_thread.run_sync(assembly.finish)
        finally:
            assembly.close()
        if address != expect.address:
            assembly.discard()
            if assembly.resumed:
                raise _ResumedMismatch()
            sessions.blame(sessions.header_peer, "its header is not the one of the file the manifest names")
            raise BlobMismatch(f"checkpoint {expect.step}: the file does not hash to its address", sessions.header_peer,
                               resumed=False)
        cache.adopt(assembly.partial, expect.address)
        assembly.record.unlink(missing_ok=True)
        try:
            cache.store_table(expect.address, table)
        except OSError as exc:  # the checkpoint is verified and kept; only its table for serving is not
            log.warning("checkpoint %d: chunk table not kept for serving: %s", expect.step, _storage_full(exc, expect.address))
        cache.evict(keep=expect.address)
    finally:
        await sessions.aclose()
    report.size = layout.size
    report.seconds = time.perf_counter() - started
    return report


def wanted_pieces(layout: Layout, chunks: Mapping[str, Iterable[int]]) -> frozenset[int]:
    """The indices into ``layout.pieces()`` of chunks ``chunks`` (tensor name → chunk indices)."""
    slots, base = {}, 0
    for t in layout.tensors:
        for i in chunks.get(t.name, ()):
            if not 0 <= i < t.chunks:
                raise ValueError(f"{t.name} has no chunk {i}")
            slots[base + i] = True
        base += t.chunks
    if not set(chunks) <= {t.name for t in layout.tensors}:
        raise ValueError(f"no tensors {sorted(set(chunks) - {t.name for t in layout.tensors})[:3]} in the checkpoint")
    return frozenset(i for i, p in enumerate(layout.pieces()) if p.slot in slots)


async def fetch_checkpoint_part(identity: Identity, peers: Sequence[BulkProvider], expect: Expectation,
                                chunks: Mapping[str, Iterable[int]], part: Path, table_path: Path, *,
                                on_bad_peer: Callable[[str], None] = lambda peer: None,
                                progress: Callable[[int, int], None] = lambda done, total: None,
                                window: int = WINDOW, chunk_timeout_s: float = CHUNK_TIMEOUT_S) -> FetchReport:
    """Only ``chunks`` (tensor name → chunk indices) of checkpoint ``expect.step``, for a spot
    check (:mod:`open1b.deterministic.spot_state`): the header and the chunk table (checked against
    h_k, which makes the table every chunk's proof), then each wanted chunk, checked on arrival
    against its table entry, written in place into the sparse file ``part`` (resumed as a whole
    fetch is); the table is then written to ``table_path``. A provider that sends a wrong chunk
    is blamed, and its chunks go to the others. ``report.size`` is the bytes received."""
    started = time.perf_counter()
    report = FetchReport(part, 0, 0.0, None)
    sessions = _Sessions(expect, report, on_bad_peer)
    try:
        header, layout, table = await sessions.dial_and_prove(identity, peers, chunk_timeout_s)
        wanted = wanted_pieces(layout, chunks)
        part.parent.mkdir(parents=True, exist_ok=True)
        record = part.with_name(part.name + ".pieces")
        assembly = await trio.to_thread.run_sync(_Assembly, part, record, expect.address, layout, header, table, wanted)
        try:
            report.resumed_pieces = assembly.resumed
            await sessions.fetch(assembly, started, window, chunk_timeout_s, progress, hash_address=False)
            await trio.to_thread.run_sync(assembly.sync)
        finally:
            assembly.close()
        try:
            await trio.to_thread.run_sync(write_atomic, table_path, table)
        except OSError as exc:
            raise _storage_full(exc, expect.address) from None
        record.unlink(missing_ok=True)
    finally:
        await sessions.aclose()
    report.size = len(header) + len(table) + sum(report.bytes_by_peer.values())
    report.seconds = time.perf_counter() - started
    return report
