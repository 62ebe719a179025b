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
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Callable

from open1b.protocol import Open1bError
from open1b.protocol.codec import decode, encode
from open1b.protocol.errors import WrongTypeError
from open1b.protocol.hashing import DIGEST_SIZE

from .p2p import P2P, Stream

log = logging.getLogger(__name__)

BLOB_PROTOCOL = "/open1b/blob/1.0.0"
MAX_CHUNK = 1 << 20
MAX_REQUEST = 128
MAX_BLOB_SIZE = 64 << 30
_MULTIHASH_BLAKE2B_256 = bytes([0xA0, 0xE4, 0x02, 0x20])  # varint(0xb220) ‖ length 32


class BlobError(Open1bError):
    """A blob could not be fetched or failed verification."""


def provider_key(digest: bytes) -> str:
    """The DHT provider key of a blob: the hex multihash of its BLAKE2b-256 digest."""
    return (_MULTIHASH_BLAKE2B_256 + digest).hex()


def file_digest(path: Path) -> bytes:
    h = hashlib.blake2b(digest_size=DIGEST_SIZE)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.digest()


class BlobCache:
    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.pinned: set[bytes] = set()

    def path(self, digest: bytes) -> Path:
        return self.dir / digest.hex()

    def has(self, digest: bytes) -> bool:
        return self.path(digest).exists()

    def open_blob(self, digest: bytes) -> Path | None:
        path = self.path(digest)
        if not path.exists():
            return None
        os.utime(path)  # mark as recently used
        return path

    def add_file(self, source: Path, *, pin: bool = False) -> bytes:
        """Copy (hard-link where possible) a local file into the cache; returns its digest."""
        digest = file_digest(source)
        target = self.path(digest)
        if not target.exists():
            tmp = target.with_suffix(".tmp")
            try:
                os.link(source, tmp)
            except OSError:
                tmp.write_bytes(Path(source).read_bytes())
            os.replace(tmp, target)
        if pin:
            self.pinned.add(digest)
        self.evict()
        return digest

    def used_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.dir.iterdir() if p.is_file())

    def evict(self) -> list[bytes]:
        """Remove least recently used, unpinned blobs until the cache fits its limit."""
        files = sorted((p for p in self.dir.iterdir() if p.is_file() and len(p.name) == 2 * DIGEST_SIZE),
                       key=lambda p: p.stat().st_mtime)
        total = self.used_bytes()
        evicted = []
        for path in files:
            if total <= self.max_bytes:
                break
            digest = bytes.fromhex(path.name)
            if digest in self.pinned:
                continue
            total -= path.stat().st_size
            path.unlink()
            evicted.append(digest)
        return evicted

    # -- serving ---------------------------------------------------------------------------
    async def serve(self, stream: Stream) -> None:
        while True:
            try:
                raw = await stream.receive(MAX_REQUEST)
            except Exception:
                return  # the requester closed the stream
            request = decode(raw, max_size=MAX_REQUEST)
            if (type(request) is not dict or set(request) != {"digest", "offset", "length"}
                    or type(request["digest"]) is not bytes or len(request["digest"]) != DIGEST_SIZE
                    or type(request["offset"]) is not int or type(request["length"]) is not int
                    or request["offset"] < 0 or not 0 < request["length"] <= MAX_CHUNK):
                raise WrongTypeError("malformed blob request")
            path = self.open_blob(request["digest"])
            if path is None:
                await stream.send(encode({"error": "not found"}))
                continue
            size = path.stat().st_size
            with open(path, "rb") as f:
                f.seek(min(request["offset"], size))
                data = f.read(request["length"])
            await stream.send(encode({"size": size}))
            await stream.send(data)

    # -- fetching --------------------------------------------------------------------------
    async def fetch(self, p2p: P2P, digest: bytes, providers: list[str],
                    progress: Callable[[int, int], None] = lambda done, total: None) -> Path:
        """Download ``digest`` from the first provider that has it, resuming a partial download,
        verify it, and return its path in the cache."""
        done = self.open_blob(digest)
        if done is not None:
            return done
        errors = []
        for peer in providers:
            try:
                return await self._fetch_from(p2p, peer, digest, progress)
            except Exception as exc:  # one provider failing is routine; try the next
                errors.append(f"{peer}: {exc}")
        raise BlobError(f"no provider delivered blob {digest.hex()[:16]}: " + "; ".join(errors) if errors
                        else f"no provider known for blob {digest.hex()[:16]}")

    async def _fetch_from(self, p2p: P2P, peer: str, digest: bytes, progress: Callable[[int, int], None]) -> Path:
        partial = self.path(digest).with_suffix(".partial")
        stream = await p2p.open_stream(peer, BLOB_PROTOCOL)
        try:
            with open(partial, "ab") as out:
                offset = out.tell()
                size = None
                while size is None or offset < size:
                    await stream.send(encode({"digest": digest, "offset": offset, "length": MAX_CHUNK}))
                    head = decode(await stream.receive(MAX_REQUEST), max_size=MAX_REQUEST)
                    if type(head) is not dict or "size" not in head:
                        raise BlobError(f"peer answered {head!r}")
                    if size is None:
                        size = head["size"]
                        if type(size) is not int or not 0 <= size <= MAX_BLOB_SIZE:
                            raise BlobError(f"implausible blob size {size!r}")
                        if offset > size:  # a partial file longer than the blob: start over
                            out.truncate(0)
                            offset = 0
                    elif head["size"] != size:
                        raise BlobError("blob size changed during the transfer")
                    data = await stream.receive(MAX_CHUNK)
                    if not data and offset < size:
                        raise BlobError("peer sent no data")
                    out.write(data)
                    offset += len(data)
                    progress(offset, size)
                out.flush()
                os.fsync(out.fileno())
        finally:
            await stream.close()
        if offset != size or file_digest(partial) != digest:
            partial.unlink(missing_ok=True)
            raise BlobError(f"bytes from {peer} do not hash to {digest.hex()[:16]}")
        target = self.path(digest)
        os.replace(partial, target)
        self.evict()
        return target
