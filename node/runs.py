"""A run's files on a node (docs/run-format.md §6): imported from a run directory by its
publisher, fetched from peers by everyone else, always through the blob cache.

* :func:`run_blobs` lists what a manifest names: the samples file, checkpoints 0 … S and, for a
  run with fingerprints, its fingerprints file, each with its blob address, its place in a run
  directory and a bound on its size (the samples file's exact size is in the manifest; a
  checkpoint can be no larger than its model allows, a fingerprints file than its steps and
  slots do). A fingerprints file is also checked against the manifest's ``fingerprints_root``
  (:func:`check_fingerprints_file`) wherever it enters: published or fetched.
* :meth:`RunFiles.import_dir` is publishing: every file of the directory is staged and hashed
  *before* anything is accepted; one missing or wrong file refuses the whole run. Imported blobs
  are pinned (never evicted: the publisher serves them).
* :meth:`RunFiles.fetch` is auditing: connected peers are asked first, then the providers that
  DHT provider records name; the blob layer resumes and verifies the download against the
  manifest's address, and the node then provides the blob itself. A checkpoint goes over the
  bulk path first (:mod:`.checkpoint_fetch`: authenticated TCP sessions to several providers at
  once, every 1 MiB chunk checked against h_k on arrival), and over the libp2p blob stream only
  when no provider serves it there (docs/run-format.md §6.6).
* :meth:`RunFiles.assemble` builds ``<data dir>/runs/<run hex>/`` — ``manifest.cbor``,
  ``samples.bin``, ``checkpoints/<k:08d>.safetensors`` — as hard links into the cache, and hands
  that to the replay worker, which re-verifies the checkpoint's address and state hash.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import trio

from open1b.deterministic.config import from_manifest_model
from open1b.deterministic.provenance import load_run_samples
from open1b.deterministic.runfile import (
    CHECKPOINT_DIR,
    ENGINE,
    MANIFEST_FILE,
    REPLAYABLE_ENGINE_VERSIONS,
    SAMPLES_FILE,
    max_checkpoint_bytes,
)
from open1b.deterministic.samples import Dataset
from open1b.deterministic.spot_state import part_paths
from open1b.protocol import Identity, Open1bError, RunManifest
from open1b.protocol.errors import ProtocolError
from open1b.protocol.fingerprints import FINGERPRINTS_FILE, decode_fingerprints, max_fingerprints_size
from open1b.protocol.fingerprints import committed as committed_fingerprints
from open1b.protocol.spotcheck import run_slots

from .blobs import BlobCache, BlobError, provider_key
from .bulk import BulkProvider, BulkServer, find_bulk_peer
from .checkpoint_fetch import fetch_checkpoint, fetch_checkpoint_part
from .chunk_table import checkpoint_expectation
from .files import FileRefused, StorageFull, open_regular, read_bounded, write_atomic
from .p2p import P2P

log = logging.getLogger(__name__)

RUNS_DIR = "runs"
MAX_SAMPLES_FILE = 1 << 30
"""A node declines runs whose samples file is larger than this."""
MAX_FALLBACK_PEERS = 8
"""Connected peers asked directly, before the DHT is asked for providers."""
FIND_PROVIDERS_TIMEOUT_S = 10.0

Progress = Callable[[int, int, str], None]  # (done, total, note)


class RunFilesError(Open1bError):
    """A run's files are missing, wrong, or cannot be obtained."""


class NoRoomForRunFiles(RunFilesError):
    """Our disk has no room (left, above the reserve) for a run's files: no peer's fault, and a
    later try may find room."""


@dataclass(frozen=True)
class RunBlob:
    name: str  # "samples", "checkpoint 3"
    relpath: str  # where it lives in a run directory
    digest: bytes
    size: int | None  # exact size when the manifest says it
    max_size: int


def checkpoint_relpath(step: int) -> str:
    return f"{CHECKPOINT_DIR}/{step:08d}.safetensors"


def checkpoint_limit(manifest: RunManifest) -> int:
    """The largest checkpoint the run's model allows (its ``model`` map must be well-formed)."""
    try:
        _, config, _ = from_manifest_model(dict(manifest.model))
    except Open1bError as exc:
        raise RunFilesError(f"run {manifest.run_id.hex()[:16]}: {exc}") from exc
    return max_checkpoint_bytes(config)


def samples_blob(manifest: RunManifest) -> RunBlob:
    return RunBlob("samples", SAMPLES_FILE, manifest.samples_blob, manifest.samples_size, manifest.samples_size)


def checkpoint_blob(manifest: RunManifest, step: int, limit: int | None = None) -> RunBlob:
    return RunBlob(f"checkpoint {step}", checkpoint_relpath(step), manifest.checkpoints[step], None,
                   limit if limit is not None else checkpoint_limit(manifest))


def fingerprints_blob(manifest: RunManifest) -> RunBlob | None:
    """The run's fingerprints file (docs/run-format.md §10.1), None when it commits to none."""
    commitments = committed_fingerprints(manifest.data)  # well-formed: the manifest was decoded
    if commitments is None:
        return None
    return RunBlob("fingerprints", FINGERPRINTS_FILE, commitments[1], None,
                   max_fingerprints_size(manifest.steps, run_slots(manifest)))


def check_fingerprints_file(path: Path, manifest: RunManifest) -> None:
    """Raise :class:`RunFilesError` unless ``path`` (read bounded: the blob's size bound) holds the
    fingerprints whose Merkle root is the manifest's ``fingerprints_root``. The blob address
    checked the bytes already; this checks that the trainer signed a root that fits them."""
    blob = fingerprints_blob(manifest)
    if blob is None:
        raise RunFilesError("the run commits to no fingerprints")
    root, _ = committed_fingerprints(manifest.data)
    try:
        decode_fingerprints(read_bounded(path, blob.max_size), steps=manifest.steps, slots=run_slots(manifest),
                            root=root)  # fmt: skip
    except (FileRefused, ProtocolError) as exc:
        raise RunFilesError(f"fingerprints: {exc}") from None


def blob_count(manifest: RunManifest) -> int:
    """How many blobs the manifest names (:func:`run_blobs`, without checking its model)."""
    return manifest.steps + 2 + (committed_fingerprints(manifest.data) is not None)


def run_blobs(manifest: RunManifest) -> list[RunBlob]:
    limit = checkpoint_limit(manifest)
    fingerprints = fingerprints_blob(manifest)
    return [samples_blob(manifest)] + [checkpoint_blob(manifest, k, limit) for k in range(manifest.steps + 1)] + (
        [fingerprints] if fingerprints is not None else [])


def why_not_auditable(manifest: RunManifest) -> str | None:
    """Why this node cannot replay the run (None: it can). A node runs only its own engine."""
    if manifest.engine != ENGINE or manifest.engine_version not in REPLAYABLE_ENGINE_VERSIONS:
        return (f"engine {manifest.engine} {manifest.engine_version} (this node replays {ENGINE} "
                f"{', '.join(REPLAYABLE_ENGINE_VERSIONS)})")
    if manifest.samples_size > MAX_SAMPLES_FILE:
        return f"samples file of {manifest.samples_size} bytes exceeds {MAX_SAMPLES_FILE}"
    try:
        checkpoint_limit(manifest)
    except RunFilesError as exc:
        return str(exc)
    return None


def _source_size(source: Path, blob: RunBlob) -> int:
    """The size of ``blob``'s file in the run directory ``source``, checked against the manifest
    without reading it (a regular file, not a symlink, within the manifest's bound)."""
    path = source / blob.relpath
    try:
        fd, size = open_regular(path, blob.max_size)
    except FileRefused as exc:
        if not os.path.lexists(path):
            raise RunFilesError(f"{blob.name}: missing file {path}") from None
        raise RunFilesError(f"{blob.name}: {exc}") from None
    os.close(fd)
    if blob.size is not None and size != blob.size:
        raise RunFilesError(f"{blob.name}: {path} has {size} bytes; the manifest says {blob.size}")
    return size


SOURCES_KEPT = 256


@dataclass
class FetchStats:
    fetched: int = 0  # blobs downloaded and verified
    bulk_fetched: int = 0  # of which checkpoints over the bulk path, every chunk checked against h_k
    fetched_bytes: int = 0
    failed: int = 0  # fetches that found no honest provider
    bad_providers: int = 0  # providers caught serving wrong bytes
    cached: int = 0  # requests answered by the cache
    in_flight: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (done, total)
    # Where the latest fetches came from: {"blob", "path" ("bulk" or "libp2p"), "from" (peers),
    # "relayed"}; the nat scenario counts checkpoints that crossed a relay from it (must be none)
    sources: deque = field(default_factory=lambda: deque(maxlen=SOURCES_KEPT))


@dataclass(frozen=True)
class BulkFetch:
    """What fetching checkpoint ``step`` over the bulk path needs: our identity (its sessions are
    authenticated both ways), the manifest, and ``samples_dir``, a directory holding the run's
    ``samples.bin`` (checked against the manifest when read): from the two, the fetcher derives
    what every chunk is checked against (h_k, whose preimage includes the batch of step k-1)."""

    identity: Identity
    manifest: RunManifest
    step: int
    samples_dir: Path


BULK_PORT_TTL_S = 30.0  # how long a peer's bulk port is reused before it is asked again


class _BulkPorts:
    """Peers' bulk addresses, asked over libp2p and kept :data:`BULK_PORT_TTL_S`: every checkpoint
    fetch asks every candidate, and a round trip per peer per fetch cost as much as fetching a
    small checkpoint. A stale port costs one failed dial (that peer is then skipped for that
    fetch, and the libp2p path remains)."""

    def __init__(self, server: BulkServer | None) -> None:
        self.server = server  # our bulk listener, where providers behind NAT dial us back
        self._known: dict[str, tuple[BulkProvider, float]] = {}

    async def of(self, p2p: P2P, peer_ids: list[str]) -> list[BulkProvider]:
        """The bulk addresses of ``peer_ids`` that have one (or the dial-backs of those behind
        NAT), those not known asked in parallel, in ``peer_ids``' order."""
        now = time.monotonic()
        found = {p: peer for p, (peer, until) in self._known.items() if until > now and p in peer_ids}

        async def ask(peer_id: str) -> None:
            peer = await find_bulk_peer(p2p, peer_id, self.server)
            if peer is not None:
                found[peer_id] = peer
                self._known[peer_id] = (peer, time.monotonic() + BULK_PORT_TTL_S)

        async with trio.open_nursery() as nursery:
            for peer_id in peer_ids:
                if peer_id not in found:
                    nursery.start_soon(ask, peer_id)
        for p in [p for p, (_, until) in self._known.items() if until <= now]:
            del self._known[p]
        return [found[p] for p in peer_ids if p in found]


DATASETS_KEPT = 4  # runs whose checked samples stay in memory (each at most MAX_SAMPLES_BYTES)
COPY_CHUNK = 1 << 20  # what assemble's copy holds in memory at once


def _copy_streamed(source: Path, target: Path) -> None:
    """Copy ``source`` to ``target`` COPY_CHUNK bytes at a time (a checkpoint can be gigabytes);
    a failed copy (a full disk) removes the partial one."""
    try:
        with open(source, "rb") as src, open(target, "wb") as dst:
            while chunk := src.read(COPY_CHUNK):
                dst.write(chunk)
    except OSError:
        target.unlink(missing_ok=True)
        raise


class RunFiles:
    def __init__(self, data_dir: Path, cache: BlobCache, bulk: BulkServer | None = None) -> None:
        """``bulk``: our bulk listener (serving ``cache``), where a provider behind NAT dials us
        back; without one, checkpoints come over the bulk path only from providers we can dial."""
        self.root = Path(data_dir) / RUNS_DIR
        self.cache = cache
        self.stats = FetchStats()
        self._locks: dict[bytes, trio.Lock] = {}
        self._datasets: dict[bytes, Dataset] = {}  # run -> its checked samples (:meth:`_dataset`)
        self.bulk = bulk
        self._bulk_ports = _BulkPorts(bulk)

    def work_dir(self, run: bytes, purpose: str = "") -> Path:
        """Replays use ``<run hex>/``; another user of a run's files (the spot checker) its own
        ``<run hex>-<purpose>/``, so that neither unlinks what the other is reading."""
        return self.root / (run.hex() + (f"-{purpose}" if purpose else ""))

    # -- publishing ------------------------------------------------------------------------
    async def import_dir(self, manifest: RunManifest, source: Path, progress: Progress = lambda d, t, n: None, *,
                         move: bool = False) -> int:
        """Check every file of ``source`` against ``manifest`` and import them all, pinned; or
        import nothing and raise :class:`RunFilesError` naming the first bad file. Returns the
        bytes imported. Files are copied (never linked) while hashed, so the trainer changing
        them later cannot change what this node verified and serves; blobs the cache holds
        already are hashed from the directory but not copied again. With ``move`` (an 11 GB
        checkpoint need not take twice its disk), each file is renamed into the cache and hashed
        there (:meth:`.blobs.BlobCache.move_in`): refused before anything moves unless every file
        is on the cache's filesystem with no other name, and moved back if the run is refused.
        ``progress`` hears of each file, and within a large one of every 256 MiB hashed."""
        blobs = run_blobs(manifest)
        sizes = [await trio.to_thread.run_sync(_source_size, source, b) for b in blobs]
        held = [self.cache.has(b.digest) for b in blobs]
        if move:  # every file's filesystem before the first rename: no half-moved run
            for blob, have in zip(blobs, held):
                if not have:
                    try:
                        self.cache.same_filesystem(source / blob.relpath)
                    except BlobError as exc:
                        raise RunFilesError(f"{blob.name}: {exc}") from None
        else:  # before copying a byte: a full disk fails here, not half-way
            self.cache.room(sum(size for size, have in zip(sizes, held) if not have))
        staged: list[tuple[RunBlob, Path]] = []
        try:
            for i, (blob, have, size) in enumerate(zip(blobs, held, sizes)):
                progress(i, len(blobs), f"checking {blob.name}")

                def on_bytes(done: int, i=i, blob=blob, size=size) -> None:
                    progress(i, len(blobs), f"checking {blob.name}: {done >> 20} of {size >> 20} MiB")

                # a blob we hold already is still checked against this directory's file (hashed,
                # not copied): a publish vouches for the directory it names
                way = self.cache.check if have else self.cache.move_in if move else self.cache.stage
                check = functools.partial(way, source / blob.relpath, blob.digest, max_size=blob.max_size,
                                          on_bytes=on_bytes)
                try:
                    done = await trio.to_thread.run_sync(check)
                except (BlobError, FileRefused) as exc:
                    raise RunFilesError(f"{blob.name}: {exc}") from None
                if done is not None:
                    staged.append((blob, done))
                if blob.relpath == FINGERPRINTS_FILE:  # its root too: a run is refused whole, before import
                    await trio.to_thread.run_sync(check_fingerprints_file, done or self.cache.path(blob.digest),
                                                  manifest)
        except BaseException:
            for blob, tmp in staged:
                if move:
                    os.rename(tmp, source / blob.relpath)
                else:
                    tmp.unlink(missing_ok=True)
            raise
        total_bytes = sum(size for size, have in zip(sizes, held) if not have)
        for blob, tmp in staged:
            self.cache.commit(tmp, blob.digest, pin=True)
        self.pin(manifest)
        progress(len(blobs), len(blobs), "checked")
        return total_bytes

    def pin(self, manifest: RunManifest) -> None:
        self.cache.pinned.update(b.digest for b in run_blobs(manifest))

    # -- fetching --------------------------------------------------------------------------
    async def fetch(self, p2p: P2P, blob: RunBlob, on_bad_peer: Callable[[str], None],
                    provide: Callable[[str], None] | None = None, bulk: BulkFetch | None = None) -> Path:
        """``blob`` in the cache, fetched from peers if needed, verified against its address.
        With ``bulk`` (checkpoints), the bulk path is tried first. A fetched blob is then provided:
        by ``provide(key)`` (which should not block the replay waiting for it, e.g. by starting a
        task) or, without it, before returning. The blob is held in the cache until :meth:`assemble`
        links it into a working directory: other fetches may finish and evict meanwhile."""
        lock = self._locks.setdefault(blob.digest, trio.Lock())  # one download per blob at a time
        try:
            path, fetched = await self._fetch_locked(p2p, blob, on_bad_peer, lock, bulk)
            self.cache.hold(blob.digest)  # until assemble links it (the link keeps it after)
            if fetched:
                key = provider_key(blob.digest)
                if provide is not None:
                    provide(key)
                else:
                    with trio.move_on_after(FIND_PROVIDERS_TIMEOUT_S):
                        await p2p.provide(key)  # we hold it now: serve it too
            return path
        finally:
            if not lock.locked() and not lock.statistics().tasks_waiting:
                self._locks.pop(blob.digest, None)

    async def _fetch_locked(self, p2p: P2P, blob: RunBlob, on_bad_peer: Callable[[str], None],
                            lock: trio.Lock, bulk: BulkFetch | None) -> tuple[Path, bool]:
        async with lock:
            path = self.cache.open_blob(blob.digest)
            if path is not None:
                self.stats.cached += 1
                return path, False
            started = time.monotonic()
            if blob.size is not None and blob.size > self.cache.max_bytes:
                log.warning("%s is %d bytes, more than the blob cache's %d (blob_cache_bytes): kept while in use, "
                            "then evicted and fetched again when needed", blob.name, blob.size, self.cache.max_bytes)

            def bad(peer: str) -> None:
                self.stats.bad_providers += 1
                log.warning("%s of a run: provider %s served bytes that are not the blob; penalised", blob.name, peer)
                on_bad_peer(peer)

            def progress(done: int, total: int) -> None:
                self.stats.in_flight[blob.name] = (done, total)

            # As bitswap does: first the peers we are connected to (one short request each; a
            # peer without the blob says so at once, and they are reachable now), then the
            # providers the DHT names — whose lookup, and dials to providers we cannot reach (a
            # partition, a NAT), can each take seconds.
            connected = p2p.connected_peers()[:MAX_FALLBACK_PEERS]
            providers: list[str] | None = None  # looked up in the DHT at most once

            async def dht_providers() -> list[str]:
                nonlocal providers
                if providers is None:
                    providers = []
                    with trio.move_on_after(FIND_PROVIDERS_TIMEOUT_S):
                        providers = [p for p in await p2p.find_providers(provider_key(blob.digest))
                                     if p not in connected]
                return providers

            async def over_libp2p(peers: list[str]) -> Path:
                path = await self.cache.fetch(p2p, blob.digest, peers, progress, size=blob.size,
                                              max_size=blob.max_size, on_bad_peer=bad)
                peer, relayed = self.cache.delivered_by.pop(blob.digest, ("", False))
                self.stats.sources.append({"blob": blob.name, "path": "libp2p", "from": [peer], "relayed": relayed})
                return path

            try:
                path = None
                if bulk is not None:
                    path = await self._fetch_bulk(p2p, bulk, connected, dht_providers, bad, progress)
                if path is None:
                    try:
                        path = await over_libp2p(connected)
                    except BlobError as first:
                        if not await dht_providers():
                            raise first
                        path = await over_libp2p(await dht_providers())
            except StorageFull as exc:  # our disk: no provider is to blame, and a later try may find room
                raise NoRoomForRunFiles(f"{blob.name}: {exc}") from None
            except BlobError as exc:
                self.stats.failed += 1
                raise RunFilesError(f"{blob.name}: {exc}") from None
            finally:
                self.stats.in_flight.pop(blob.name, None)
            size = path.stat().st_size
            self.stats.fetched += 1
            self.stats.fetched_bytes += size
            seconds = time.monotonic() - started
            log.info("fetched %s (%d bytes, blob %s) in %.2f s (%.1f MB/s)", blob.name, size, blob.digest.hex()[:12],
                     seconds, size / max(seconds, 1e-6) / 1e6)
            return path, True

    async def _dataset(self, manifest: RunManifest, samples_dir: Path) -> Dataset:
        """The run's samples, read and checked against the manifest once: every checkpoint fetched
        on the bulk path needs them (h_k's preimage), and reading and checking them took longer
        than fetching a small checkpoint."""
        run = manifest.run_id
        dataset = self._datasets.pop(run, None)
        if dataset is None:
            dataset = await trio.to_thread.run_sync(load_run_samples, samples_dir, manifest)
        self._datasets[run] = dataset  # most recently used last
        while len(self._datasets) > DATASETS_KEPT:
            del self._datasets[next(iter(self._datasets))]
        return dataset

    async def _fetch_bulk(self, p2p: P2P, bulk: BulkFetch, connected: list[str], dht_providers,
                          bad: Callable[[str], None], progress: Callable[[int, int], None]) -> Path | None:
        """The checkpoint over the bulk path from the connected peers, else from the DHT's
        providers; None when no provider serves it there (the caller falls back to libp2p). A
        provider caught sending a chunk that contradicts h_k has been blamed through ``bad``."""
        manifest, step = bulk.manifest, bulk.step
        started = time.monotonic()
        try:  # h_k's preimage: nothing a chunk is checked against comes from a provider
            dataset = await self._dataset(manifest, bulk.samples_dir) if step > 0 else None
            expect = checkpoint_expectation(manifest, step, dataset)
        except Open1bError as exc:  # samples that are not the manifest's: the replay reports it
            log.info("checkpoint %d: no bulk fetch without the run's samples: %s", step, exc)
            return None
        expected_at = time.monotonic()
        for candidates in (connected, None):
            peer_ids = candidates if candidates is not None else await dht_providers()
            asked_at = time.monotonic()
            peers = await self._bulk_ports.of(p2p, peer_ids)
            ports_s = time.monotonic() - asked_at
            if not peers:
                continue
            try:
                report = await fetch_checkpoint(self.cache, bulk.identity, peers, expect, on_bad_peer=bad,
                                                progress=progress)
            except BlobError as exc:
                log.info("checkpoint %d over the bulk path: %s", step, exc)
                continue
            self.stats.bulk_fetched += 1
            # a bulk session is a TCP connection between the provider's address and ours, dialled by
            # either (never a circuit address, bulk.find_bulk_peer): it cannot run through a relay
            self.stats.sources.append({"blob": f"checkpoint {step}", "path": "bulk", "relayed": False,
                                       "from": sorted(p for p, n in report.bytes_by_peer.items() if n),
                                       "dialled_back": [p for p in report.dialled_back if report.bytes_by_peer.get(p)]})
            # Where a fetch's time goes (a small checkpoint's is mostly round trips, not bytes).
            log.info("checkpoint %d over the bulk path: h_k's preimage %.2f s, %d of %d peers' bulk ports %.2f s, "
                     "fetch %.2f s (first verified chunk %s)", step, expected_at - started, len(peers), len(peer_ids),
                     ports_s, report.seconds,
                     "-" if report.first_verified_s is None else f"{report.first_verified_s:.2f} s")
            return report.path
        return None

    async def fetch_part(self, p2p: P2P, bulk: BulkFetch, chunks: dict[str, tuple[int, ...]], work: Path,
                         on_bad_peer: Callable[[str], None]) -> int | None:
        """Only ``chunks`` (tensor name → chunk indices) of checkpoint ``bulk.step``, for a spot check:
        over the bulk path, each chunk checked against the h_k-proven chunk table, held in part in
        the working directory ``work`` (:func:`open1b.deterministic.spot_state.part_paths`). The
        bytes received; None when no provider delivered them there (the caller fetches the whole
        checkpoint instead). Nothing enters the cache: a blob is served only once whole and verified."""
        manifest, step = bulk.manifest, bulk.step
        try:
            dataset = await self._dataset(manifest, bulk.samples_dir) if step > 0 else None
            expect = checkpoint_expectation(manifest, step, dataset)
        except Open1bError as exc:
            log.info("checkpoint %d: no fetch in part without the run's samples: %s", step, exc)
            return None
        connected = p2p.connected_peers()[:MAX_FALLBACK_PEERS]
        for peer_ids in (connected, None):
            if peer_ids is None:
                peer_ids = []
                with trio.move_on_after(FIND_PROVIDERS_TIMEOUT_S):
                    peer_ids = [p for p in await p2p.find_providers(provider_key(expect.address)) if p not in connected]
            peers = await self._bulk_ports.of(p2p, peer_ids)
            if not peers:
                continue
            try:
                report = await fetch_checkpoint_part(bulk.identity, peers, expect, chunks, *part_paths(work, step),
                                                     on_bad_peer=on_bad_peer)
            except StorageFull as exc:
                raise NoRoomForRunFiles(f"checkpoint {step} (in part): {exc}") from None
            except BlobError as exc:
                log.info("checkpoint %d in part over the bulk path: %s", step, exc)
                continue
            self.stats.fetched_bytes += report.size
            log.info("checkpoint %d in part: %d bytes in %.2f s", step, report.size, report.seconds)
            return report.size
        return None

    async def fetch_fingerprints(self, p2p: P2P, manifest: RunManifest, on_bad_peer: Callable[[str], None],
                                 provide: Callable[[str], None] | None = None) -> Path:
        """The run's fingerprints file in the cache, fetched as :meth:`fetch` does (size-bounded,
        verified against ``fingerprints_blob``) and then checked against ``fingerprints_root``.
        :class:`RunFilesError` when the run commits to none or its root does not fit the file
        (the publisher signed both: no provider is blamed for that)."""
        blob = fingerprints_blob(manifest)
        if blob is None:
            raise RunFilesError(f"run {manifest.run_id.hex()[:16]} commits to no fingerprints")
        path = await self.fetch(p2p, blob, on_bad_peer, provide)
        await trio.to_thread.run_sync(check_fingerprints_file, path, manifest)
        return path

    # -- the working directory handed to the replay worker ----------------------------------
    def assemble(self, manifest: RunManifest, blobs: list[RunBlob], purpose: str = "") -> Path:
        """``<data dir>/runs/<run>/`` (:meth:`work_dir`) with the manifest and ``blobs`` linked in
        from the cache. A full disk, at any of its writes, is :class:`RunFilesError` ("no space
        left"), as is any other failure to write there (a read-only remount): its callers retry
        later, as they do a blob no provider delivered, where a bare ``OSError`` would end the
        auditor's task, and the daemon with it."""
        work = self.work_dir(manifest.run_id, purpose)
        name = "the manifest"
        try:
            if not (work / MANIFEST_FILE).exists():
                write_atomic(work / MANIFEST_FILE, manifest.encoded)
            for blob in blobs:
                name = blob.name
                target = work / blob.relpath
                source = self.cache.open_blob(blob.digest)
                if source is None:
                    raise RunFilesError(f"{blob.name}: evicted from the cache before use")
                target.parent.mkdir(parents=True, exist_ok=True)
                tmp = target.with_name(target.name + ".tmp")
                tmp.unlink(missing_ok=True)
                try:
                    os.link(source, tmp)
                except OSError:  # another filesystem, or links refused: a copy, streamed, never read whole
                    _copy_streamed(source, tmp)
                os.replace(tmp, target)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise NoRoomForRunFiles(f"{name}: no space left on {work} to assemble it") from None
            # A disk remounted read-only, a quota, an I/O error: the node's disk, not a verdict on
            # the run and no peer's fault; retried later like a full disk.
            raise RunFilesError(f"{name}: cannot write it to {work}: {exc.strerror or exc}") from None
        finally:
            for blob in blobs:  # linked (the link keeps it), or failed (nothing will use it)
                self.cache.unhold(blob.digest)
        return work

    def release(self, manifest: RunManifest, blobs: list[RunBlob], purpose: str = "") -> None:
        """Drop the working directory's links; the blobs are evicted if the cache is over its
        limit (a blob larger than the limit was kept only while linked)."""
        work = self.work_dir(manifest.run_id, purpose)
        for blob in blobs:
            (work / blob.relpath).unlink(missing_ok=True)
        self.cache.evict()
