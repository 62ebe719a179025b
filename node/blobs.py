"""Content-addressed blobs (checkpoints, data samples) moved between peers.

* Address: the BLAKE2b-256 digest of the bytes. In the DHT a blob is located through provider
  records under the multihash of that digest (blake2b-256 is multicodec 0xb220).
* Cache: ``<dir>/<hex digest>``; a download in progress is ``<hex>.partial`` and resumes from its
  size; a finished download is verified against its digest *before* it is renamed into place
  (a peer that sends other bytes wasted our bandwidth, never our trust). The cache is bounded:
  least recently used blobs are evicted, pinned ones never.
* Stream protocol ``/open1b/blob/1.0.0`` (varint frames): the requester sends canonical CBOR
  ``{"digest": h, "offset": o, "length": n}`` (n ≤ MAX_CHUNK); the server answers one CBOR frame
  ``{"size": total}`` or ``{"error": text}``, then (on success) one frame with the bytes
  ``[o, o + n)`` clipped to the blob. Requests repeat on the same stream until the requester
  closes it.
* Chunk tables: for a checkpoint the cache also keeps ``<hex>.table``, its chunk table
  (:mod:`.chunk_table`), computed once or stored by the fetch that verified it; the bulk path
  (:mod:`.bulk`) serves it, and it is evicted with its blob.
* Blame: a provider whose bytes do not hash to the address (or that announces a size the
  requester knows to be wrong) is reported through ``on_bad_peer``, so the node can penalise it
  like any other provably invalid message. Bytes resumed from an earlier provider's partial
  download cannot be attributed: such a file is discarded and fetched again from scratch.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import stat
from collections import Counter
from pathlib import Path
from typing import Callable

import trio

from open1b.protocol import Open1bError
from open1b.protocol.codec import decode, encode
from open1b.protocol.errors import DecodeError, WrongTypeError
from open1b.protocol.hashing import DIGEST_SIZE

from .chunk_table import compute_table
from .files import FileRefused, StorageFull, check_free, open_regular
from .p2p import P2P, NetworkError, Stream

log = logging.getLogger(__name__)

BLOB_PROTOCOL = "/open1b/blob/1.0.0"
MAX_CHUNK = 1 << 20
MAX_REQUEST = 128
MAX_BLOB_SIZE = 64 << 30
PROGRESS_BYTES = 256 << 20  # how often a copy or hash of one file reports its progress
CHUNK_TIMEOUT_S = 30.0
OPEN_TIMEOUT_S = 10.0
_MULTIHASH_BLAKE2B_256 = bytes([0xA0, 0xE4, 0x02, 0x20])  # varint(0xb220) ‖ length 32
_FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)


class BlobError(Open1bError):
    """A blob could not be fetched or failed verification."""


# What a provider, or the network between us, can make a download fail with: that provider failed,
# and the next is tried. Nothing else is: our disk stops the fetch blaming no one, and a bug of ours
# (a TypeError, say) propagates instead of passing for a provider's failure.
PROVIDER_FAILURES = (NetworkError, BlobError, DecodeError, trio.TooSlowError)


class BlobMismatch(BlobError):
    """A provider delivered bytes (or a size) that cannot be the blob: its fault when the whole
    download came from it (``resumed`` False), unattributable otherwise."""

    def __init__(self, message: str, peer: str, resumed: bool) -> None:
        super().__init__(message)
        self.peer, self.resumed = peer, resumed


def provider_key(digest: bytes) -> str:
    """The DHT provider key of a blob: the hex multihash of its BLAKE2b-256 digest."""
    return (_MULTIHASH_BLAKE2B_256 + digest).hex()


def file_digest(path: Path) -> bytes:
    h = hashlib.blake2b(digest_size=DIGEST_SIZE)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.digest()


def _links(path: Path) -> int:
    try:
        return path.stat().st_nlink
    except FileNotFoundError:
        return 0


def _stamp(st: os.stat_result) -> tuple[int, int]:
    return st.st_size, st.st_mtime_ns


def _reflink(src: int, dst: int) -> bool:
    """Clone ``src`` into ``dst`` copy-on-write (btrfs, XFS); False where the filesystem cannot."""
    try:
        fcntl.ioctl(dst, _FICLONE, src)
    except OSError:
        return False
    return True


class BlobCache:
    """The cache directory. Every blob in it is the node's own file: imported by copy (or
    copy-on-write clone), never a hard link to a file someone else can write, and the cache never
    touches a file outside its directory. Recency for eviction is kept in memory (not in mtimes),
    so a blob's size and mtime stay what they were when it was verified: a blob whose size or
    mtime changed since is hashed again before it is served (:meth:`open_verified`)."""

    def __init__(self, directory: Path, max_bytes: int, *, reserve_bytes: int = 0) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.reserve_bytes = reserve_bytes
        self.pinned: set[bytes] = set()
        self.served_bytes = 0
        self.relayed_refused = 0  # blob transfers refused, either way, because the stream was relayed
        # digest -> (the provider, whether its stream was relayed) of a fetch just finished here
        self.delivered_by: dict[bytes, tuple[str, bool]] = {}
        self._table_locks: dict[bytes, trio.Lock] = {}
        self._verified: dict[bytes, tuple[int, int]] = {}  # digest -> (size, mtime_ns) when last hashed
        self._used: dict[bytes, int] = {}  # digest -> use counter (LRU order within this process)
        self.held: Counter[bytes] = Counter()  # digest -> users between its fetch and their link to it
        self._uses = 0

    def path(self, digest: bytes) -> Path:
        return self.dir / digest.hex()

    def has(self, digest: bytes) -> bool:
        return self.path(digest).exists()

    def open_blob(self, digest: bytes) -> Path | None:
        """The cached blob's path (marked as recently used), or None."""
        path = self.path(digest)
        if not path.exists():
            return None
        self._uses += 1
        self._used[digest] = self._uses
        return path

    async def open_verified(self, digest: bytes) -> Path | None:
        """As :meth:`open_blob`, for serving: a blob not hashed by this process, or whose size or
        mtime changed since, is hashed again first (in a thread); one that no longer matches its
        address is removed, logged, and reported as absent."""
        path = self.open_blob(digest)
        if path is None:
            return None
        try:
            stamp = _stamp(path.stat())
        except FileNotFoundError:
            return None
        if self._verified.get(digest) == stamp:
            return path
        if await trio.to_thread.run_sync(file_digest, path) != digest:
            log.warning("blob %s changed on disk since it was verified: removed, not served", digest.hex()[:16])
            self._remove(digest)
            return None
        self._verified[digest] = stamp
        return path

    def room(self, nbytes: int) -> None:
        """Raise :class:`~.files.StorageFull` unless ``nbytes`` more fit on the cache's filesystem
        with ``reserve_bytes`` to spare."""
        check_free(self.dir, nbytes, self.reserve_bytes)

    def adopt(self, verified: Path, digest: bytes, *, pin: bool = False) -> Path:
        """Move a file whose bytes were just checked to hash to ``digest`` into the cache."""
        target = self.path(digest)
        os.replace(verified, target)
        self._verified[digest] = _stamp(target.stat())
        if pin:
            self.pinned.add(digest)
        return target

    def add_file(self, source: Path, *, pin: bool = False) -> bytes:
        """Copy a local file into the cache (hashing it as it is copied); returns its digest."""
        staged, digest = self._copy_hashing(Path(source), self.dir / f".add.{os.getpid()}.import", MAX_BLOB_SIZE)
        assert staged is not None
        if self.has(digest):
            staged.unlink(missing_ok=True)
        else:
            self.adopt(staged, digest)
        if pin:
            self.pinned.add(digest)
        self.evict(keep=digest)
        return digest

    def stage(self, source: Path, digest: bytes, *, max_size: int = MAX_BLOB_SIZE,
              on_bytes: Callable[[int], None] = lambda done: None) -> Path:
        """Copy ``source`` (a regular file, not a symlink, at most ``max_size`` bytes) next to the
        cache and check that its bytes hash to ``digest``; returns the staged file for
        :meth:`commit`. What is committed is the copy that was hashed, so changing ``source``
        later changes nothing here. Blocking (it copies and hashes): run it in a thread."""
        staged, got = self._copy_hashing(source, self.path(digest).with_suffix(".import"), max_size, on_bytes)
        assert staged is not None
        if got != digest:
            staged.unlink(missing_ok=True)
            # the address the caller named, never the hash of what we read: the daemon may be able
            # to read files the caller cannot
            raise BlobError(f"{source}: its bytes do not hash to the manifest's address {digest.hex()[:16]}…")
        return staged

    def same_filesystem(self, source: Path) -> None:
        """Raise :class:`BlobError` unless ``source`` (a regular file with no other name) can be
        renamed into the cache: on the cache's filesystem, and not a hard link, whose other name
        would let its owner change a blob this node verified."""
        st = os.stat(source, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            raise BlobError(f"{source}: cannot move it into the blob cache: not a regular file with one name "
                            f"(it has {st.st_nlink}); publish without --move copies it")
        if st.st_dev != os.stat(self.dir).st_dev:
            raise BlobError(f"{source}: cannot move it into the blob cache {self.dir}: another filesystem "
                            "(a rename cannot cross it); publish without --move copies it")

    def move_in(self, source: Path, digest: bytes, *, max_size: int = MAX_BLOB_SIZE,
                on_bytes: Callable[[int], None] = lambda done: None) -> Path:
        """As :meth:`stage`, renaming ``source`` (:meth:`same_filesystem`) instead of copying it:
        the file becomes the cache's, then is hashed (streamed) from there, so what is committed is
        what was hashed. A file that does not hash to ``digest`` is renamed back. Blocking."""
        self.same_filesystem(source)
        staged = self.path(digest).with_suffix(".import")
        os.rename(source, staged)
        try:
            _, got = self._copy_hashing(staged, None, max_size, on_bytes)
        except BaseException:
            os.rename(staged, source)
            raise
        if got != digest:
            os.rename(staged, source)
            raise BlobError(f"{source}: its bytes do not hash to the manifest's address {digest.hex()[:16]}…")
        return staged

    def check(self, source: Path, digest: bytes, *, max_size: int = MAX_BLOB_SIZE,
              on_bytes: Callable[[int], None] = lambda done: None) -> None:
        """As :meth:`stage` without keeping a copy: raise unless ``source`` hashes to ``digest``."""
        _, got = self._copy_hashing(source, None, max_size, on_bytes)
        if got != digest:
            raise BlobError(f"{source}: its bytes do not hash to the manifest's address {digest.hex()[:16]}…")

    def _copy_hashing(self, source: Path, staged: Path | None, max_size: int,
                      on_bytes: Callable[[int], None] = lambda done: None) -> tuple[Path | None, bytes]:
        """Copy (or clone) ``source`` to ``staged``, hashing the copy (only hash it when ``staged``
        is None), 1 MiB at a time, telling ``on_bytes`` the bytes done every :data:`PROGRESS_BYTES`;
        a failed copy (a full disk included) leaves no file behind."""
        fd, _ = open_regular(source, max_size)
        out: int | None = None
        try:
            if staged is not None:
                out = os.open(staged, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            cloned = out is not None and _reflink(fd, out)
            h = hashlib.blake2b(digest_size=DIGEST_SIZE)
            copied = 0
            # a clone is ours from the start: hash what was cloned, not the source, which may change
            while chunk := os.read(out if cloned else fd, min(1 << 20, max_size + 1 - copied)):
                copied += len(chunk)
                if copied % PROGRESS_BYTES < len(chunk):
                    on_bytes(copied)
                if copied > max_size:
                    raise FileRefused(f"{source}: refused: grew past the {max_size} bytes allowed")
                h.update(chunk)
                if out is not None and not cloned:
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(out, view):]
            if out is not None:
                os.fsync(out)
        except BaseException as exc:
            if staged is not None:
                staged.unlink(missing_ok=True)
            if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
                raise StorageFull(f"no space left on {self.dir} while importing {source}") from None
            raise
        finally:
            os.close(fd)
            if out is not None:
                os.close(out)
        return staged, h.digest()

    def commit(self, staged: Path, digest: bytes, *, pin: bool = False) -> None:
        """Move a file checked by :meth:`stage` into the cache under ``digest``."""
        if self.has(digest):
            staged.unlink(missing_ok=True)
            if pin:
                self.pinned.add(digest)
        else:
            self.adopt(staged, digest, pin=pin)

    def table_path(self, digest: bytes) -> Path:
        """Where the chunk table of a cached checkpoint is kept (removed with the blob)."""
        return self.path(digest).with_suffix(".table")

    def store_table(self, digest: bytes, table: bytes) -> None:
        """Keep a checkpoint's chunk table, verified against h_k by whoever fetched it, for serving."""
        tmp = self.table_path(digest).with_suffix(".table-tmp")
        try:
            tmp.write_bytes(table)
            os.replace(tmp, self.table_path(digest))
        except OSError:
            tmp.unlink(missing_ok=True)  # a full disk leaves no half-written table behind
            raise

    async def chunk_table(self, digest: bytes) -> bytes:
        """The chunk table of the cached checkpoint ``digest`` (docs/run-format.md §6.6), computed
        once in a thread and kept beside the blob (where there is room). Raises ``ChunkTableError``
        for a blob that is not a checkpoint, ``BlobError`` for one the cache does not hold."""
        lock = self._table_locks.setdefault(digest, trio.Lock())  # one computation per blob
        try:
            async with lock:
                kept = self.table_path(digest)
                if kept.exists():
                    return kept.read_bytes()
                path = await self.open_verified(digest)
                if path is None:
                    raise BlobError(f"blob {digest.hex()[:16]} is not in the cache")
                table = await trio.to_thread.run_sync(compute_table, path)
                try:
                    self.store_table(digest, table)
                except OSError as exc:  # kept only to save recomputing it: a full disk must not stop serving it
                    log.warning("chunk table of blob %s not kept (computed again when next asked): %s",
                                digest.hex()[:16], exc)
                return table
        finally:
            if not lock.locked() and not lock.statistics().tasks_waiting:
                self._table_locks.pop(digest, None)

    def used_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.dir.iterdir() if p.is_file())

    def evict(self, keep: bytes | None = None) -> list[bytes]:
        """Remove least recently used blobs until the cache fits its limit (blobs not used by this
        process first, oldest first), never one in use: pinned, held (:meth:`hold`), linked into a
        working directory (a replay, spot check, evaluation or dispute reads it there: a second
        link), or ``keep``, the blob its caller has just adopted and is about to return. So one
        blob larger than the whole limit (a 1B model's 11 GB checkpoint against the default
        8 GiB) is kept while it is used and goes at the first eviction after."""
        files = sorted((p for p in self.dir.iterdir() if p.is_file() and len(p.name) == 2 * DIGEST_SIZE),
                       key=lambda p: (self._used.get(bytes.fromhex(p.name), 0), p.stat().st_mtime))
        total = self.used_bytes()
        evicted = []
        for path in files:
            if total <= self.max_bytes:
                break
            digest = bytes.fromhex(path.name)
            if digest in self.pinned or digest == keep or self.held[digest] > 0 or _links(path) > 1:
                continue
            total -= self._remove(digest)
            evicted.append(digest)
        return evicted

    def hold(self, digest: bytes) -> None:
        """Keep ``digest`` from eviction until :meth:`unhold`: between its fetch and its user
        linking it into a working directory (whose link then keeps it), other fetches finish and
        evict."""
        self.held[digest] += 1

    def unhold(self, digest: bytes) -> None:
        if self.held[digest] > 1:
            self.held[digest] -= 1
        else:  # no entry left behind for every blob ever fetched
            self.held.pop(digest, None)

    def _remove(self, digest: bytes) -> int:
        """Delete a blob and its chunk table; the bytes freed."""
        freed = 0
        for path in (self.path(digest), self.table_path(digest)):
            try:
                freed += path.stat().st_size
                path.unlink()
            except FileNotFoundError:
                pass
        self._verified.pop(digest, None)
        self._used.pop(digest, None)
        return freed

    # -- serving ---------------------------------------------------------------------------
    async def serve(self, stream: Stream) -> None:
        if stream.relayed:  # relays carry control traffic; the asker can fetch from a peer it reaches directly
            self.relayed_refused += 1
            log.info("blob request from %s refused: it came through a relay", stream.peer_id)
            await stream.reset()
            return
        while True:
            try:
                raw = await stream.receive(MAX_REQUEST)
            except NetworkError:
                return  # the requester closed the stream
            request = decode(raw, max_size=MAX_REQUEST)
            if (type(request) is not dict or set(request) != {"digest", "offset", "length"}
                    or type(request["digest"]) is not bytes or len(request["digest"]) != DIGEST_SIZE
                    or type(request["offset"]) is not int or type(request["length"]) is not int
                    or request["offset"] < 0 or not 0 < request["length"] <= MAX_CHUNK):
                raise WrongTypeError("malformed blob request")
            path = await self.open_verified(request["digest"])
            if path is None:
                await stream.send(encode({"error": "not found"}))
                continue
            size = path.stat().st_size
            with open(path, "rb") as f:
                f.seek(min(request["offset"], size))
                data = f.read(request["length"])
            await stream.send(encode({"size": size}))
            await stream.send(data)
            self.served_bytes += len(data)

    # -- fetching --------------------------------------------------------------------------
    async def fetch(self, p2p: P2P, digest: bytes, providers: list[str],
                    progress: Callable[[int, int], None] = lambda done, total: None, *,
                    size: int | None = None, max_size: int = MAX_BLOB_SIZE,
                    on_bad_peer: Callable[[str], None] = lambda peer: None,
                    chunk_timeout_s: float = CHUNK_TIMEOUT_S) -> Path:
        """Download ``digest`` from the first provider that has it, resuming a partial download,
        verify it, and return its path in the cache. ``size`` (when the caller knows it) and
        ``max_size`` bound what a provider may announce; each chunk must arrive within
        ``chunk_timeout_s``. A provider caught lying is passed to ``on_bad_peer``."""
        done = self.open_blob(digest)
        if done is not None:
            return done
        if size is not None:
            self.room(size)
        errors = []
        for peer in providers:
            for attempt in range(2):
                try:
                    return await self._fetch_from(p2p, peer, digest, progress, size, max_size, chunk_timeout_s)
                except StorageFull:  # our disk, not the provider's fault: stop, blame no one
                    self.path(digest).with_suffix(".partial").unlink(missing_ok=True)
                    raise
                except BlobMismatch as exc:
                    if exc.resumed and attempt == 0:
                        continue  # the partial file may have come from someone else: once more, from scratch
                    on_bad_peer(peer)
                    errors.append(f"{peer}: {exc}")
                except PROVIDER_FAILURES as exc:  # one provider failing is routine; try the next
                    errors.append(f"{peer}: {exc}")
                except OSError as exc:  # our disk, not the provider's: stop, blame no one
                    raise BlobError(f"cannot store blob {digest.hex()[:16]} here: {exc}") from exc
                break
        raise BlobError(f"no provider delivered blob {digest.hex()[:16]}: " + "; ".join(errors) if errors
                        else f"no provider known for blob {digest.hex()[:16]}")

    async def _fetch_from(self, p2p: P2P, peer: str, digest: bytes, progress: Callable[[int, int], None],
                          expected: int | None, max_size: int, chunk_timeout_s: float) -> Path:
        partial = self.path(digest).with_suffix(".partial")
        with trio.fail_after(min(chunk_timeout_s, OPEN_TIMEOUT_S)):  # a blackholed peer must not stall us
            stream = await p2p.open_stream(peer, BLOB_PROTOCOL)
        if stream.relayed:  # never a blob through a relay: the next provider, or a direct one later
            self.relayed_refused += 1
            await stream.reset()
            raise BlobError(f"{peer} is reachable only through a relay, which carries no blobs")
        resumed = False
        try:
            with open(partial, "ab") as out:
                offset = out.tell()
                resumed = offset > 0
                size = None
                while size is None or offset < size:
                    with trio.fail_after(chunk_timeout_s):
                        await stream.send(encode({"digest": digest, "offset": offset, "length": MAX_CHUNK}))
                        head = decode(await stream.receive(MAX_REQUEST), max_size=MAX_REQUEST)
                        if type(head) is not dict or "size" not in head:
                            raise BlobError(f"peer answered {head!r}")
                        if size is None:
                            size = head["size"]
                            if type(size) is not int or not 0 <= size <= min(max_size, MAX_BLOB_SIZE) or (
                                    expected is not None and size != expected):
                                raise BlobMismatch(f"{peer} announced an impossible size {size!r} for blob "
                                                   f"{digest.hex()[:16]}", peer, resumed=False)
                            if offset > size:  # a partial file longer than the blob: start over
                                out.truncate(0)
                                offset = 0
                                resumed = False
                            self.room(size - offset)
                        elif head["size"] != size:
                            raise BlobMismatch("blob size changed during the transfer", peer, resumed=False)
                        data = await stream.receive(MAX_CHUNK)
                    if not data and offset < size:
                        raise BlobError("peer sent no data")
                    out.write(data)
                    offset += len(data)
                    progress(offset, size)
                out.flush()
                os.fsync(out.fileno())
        except OSError as exc:
            if exc.errno == errno.ENOSPC:  # a full disk is ours to fix, never the provider's fault
                raise StorageFull(f"no space left on {self.dir} for blob {digest.hex()[:16]}") from None
            raise
        finally:
            with trio.move_on_after(1):
                await stream.close()
        if offset != size or await trio.to_thread.run_sync(file_digest, partial) != digest:
            partial.unlink(missing_ok=True)
            raise BlobMismatch(f"bytes from {peer} do not hash to {digest.hex()[:16]}", peer, resumed)
        target = self.adopt(partial, digest)
        self.evict(keep=digest)
        self.delivered_by[digest] = (peer, stream.relayed)  # read back (and dropped) by the caller, runs.py
        return target
