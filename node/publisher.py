"""Publishing a run: check a run directory's files against its manifest, import them into the
blob cache (pinned), provide every blob in the DHT and gossip the manifest (docs/run-format.md §6).

``publish_dir`` reads (bounded, off the event loop) and validates the manifest at once (a bad one
is the caller's error); ``start_publish`` does the rest in the background; :attr:`Publisher.publications` holds each job's progress (API
``/v1/publications``). :meth:`Publisher.serve_publisher` hosts those jobs and announces every held
blob again well before provider records expire.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import trio

from open1b.deterministic.runfile import MANIFEST_FILE
from open1b.protocol import Open1bError, RunManifest, validate_manifest
from open1b.protocol.messages import MAX_MANIFEST_SIZE

from .api import ApiError
from .blobs import provider_key
from .clock import Clock
from .files import FileRefused, read_bounded
from .jobs import JobState
from .p2p import MAX_PUBSUB_MESSAGE, P2P
from .runs import RunFiles, blob_count, run_blobs
from .statements import Statements
from .topics import RUNS_TOPIC

log = logging.getLogger("open1b.node.publisher")

MAX_GOSSIP_MANIFEST = MAX_PUBSUB_MESSAGE - 4096  # room for the pubsub envelope; larger ones travel by sync
REPROVIDE_S = 12 * 3600.0  # provider records expire after 48 h (py-libp2p): announce again well before
# A provide is a DHT walk, mostly waiting on peers' replies: one after another, a run of S steps
# took S walks end to end (~1 s each in a loaded devnet, seconds each across the internet: a day
# for a real run's 80,957 checkpoints). A few at once overlap the waits without flooding peers.
PROVIDES_IN_FLIGHT = 8
PUBLISHED_DIR = "published"  # a moved run's working directory (links into the cache), for its answers


@dataclass
class Publication:
    """One publish job's progress, as ``/v1/publications`` shows it."""

    run: str
    dir: str
    steps: int
    started_at: int
    state: JobState = JobState.CHECKING
    done: int = 0
    total: int = 0
    note: str = ""
    bytes: int = 0
    provided: int = 0
    gossiped: bool = False
    moved: bool = False  # the files were renamed into the blob cache (publish --move), not copied
    error: str | None = None
    seconds: float | None = None

    def as_json(self) -> dict:
        return asdict(self)


async def provide_all(p2p: P2P, digests: list[bytes], provided=lambda done, ok: None) -> None:
    """Provide every blob in ``digests``, :data:`PROVIDES_IN_FLIGHT` at a time, calling
    ``provided(done so far, this one succeeded)`` as each ends."""
    todo, done = iter(digests), 0

    async def provider() -> None:
        nonlocal done
        for digest in todo:  # one iterator shared by the providers: each blob is taken once
            ok = bool(await p2p.provide(provider_key(digest)))
            done += 1
            provided(done, ok)

    async with trio.open_nursery() as nursery:
        for _ in range(min(PROVIDES_IN_FLIGHT, len(digests))):
            nursery.start_soon(provider)


def read_run_manifest(run_dir: Path, now: int) -> RunManifest:
    """``run_dir``'s manifest, validated as gossip would be; :class:`ApiError` (400) if it is not
    one. The file is read bounded (:func:`~.files.read_bounded`): not a symlink, a regular file,
    at most a manifest's size. Blocking: from the event loop use :func:`read_run_manifest_async`."""
    try:
        data = read_bounded(run_dir / MANIFEST_FILE, MAX_MANIFEST_SIZE)
    except FileRefused as exc:
        raise ApiError(400, f"no run at {run_dir}: {exc}") from None
    verdict = validate_manifest(data, now)
    if not verdict.accepted or not isinstance(verdict.message, RunManifest):
        raise ApiError(400, f"{run_dir / MANIFEST_FILE}: {verdict.reason if not verdict.accepted else 'not a run manifest'}")
    return verdict.message


async def read_run_manifest_async(run_dir: Path, now: int) -> RunManifest:
    """:func:`read_run_manifest` off the event loop (a slow or hostile file never stalls the node)."""
    return await trio.to_thread.run_sync(read_run_manifest, run_dir, now)


class Publisher:
    def __init__(self, statements: Statements, runfiles: RunFiles, p2p: P2P, *, bootstrapped: trio.Event,
                 clock: Clock) -> None:
        self.statements, self.runfiles, self.p2p = statements, runfiles, p2p
        self.bootstrapped, self.clock = bootstrapped, clock
        self.publications: dict[str, Publication] = {}  # run hex -> its latest publish job
        self._nursery: trio.Nursery | None = None

    async def serve_publisher(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Host publish jobs until cancelled; twice a day, announce every blob we hold again."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await self.bootstrapped.wait()
            while True:
                await self.clock.sleep(REPROVIDE_S)
                held = [bytes.fromhex(p.name) for p in self.runfiles.cache.dir.iterdir() if len(p.name) == 64]
                await provide_all(self.p2p, held)

    async def publish_dir(self, run_dir: Path, *, move: bool = False) -> Publication:
        """Read and validate ``run_dir``'s manifest now (off the event loop); check, import, provide
        and announce its files in the background. Raises :class:`ApiError` for a bad manifest, or
        for a run directory or ``checkpoints/`` that is a symbolic link: files are opened without
        following a link in their last component, and a linked directory would take them elsewhere."""
        for path, what in ((Path(run_dir), "the run directory"), (Path(run_dir) / "checkpoints", "its checkpoints/")):
            if path.is_symlink():
                raise ApiError(400, f"{path}: refused: {what} is a symbolic link (name the directory itself)")
        run_dir = Path(run_dir).resolve()
        return self.start_publish(run_dir, await read_run_manifest_async(run_dir, self.clock.wall()), move=move)

    def start_publish(self, run_dir: Path, manifest: RunManifest, *, move: bool = False) -> Publication:
        """Check, import, provide and announce ``run_dir``'s files (already validated against
        ``manifest``) in the background; with ``move``, rename them into the blob cache instead of
        copying them (:meth:`.runs.RunFiles.import_dir`)."""
        if self._nursery is None:
            raise RuntimeError("start_publish before serve_publisher started")
        run_dir = Path(run_dir).resolve()
        run = manifest.run_id.hex()
        job = self.publications.get(run)
        if job is not None and not job.state.finished:
            return job
        job = Publication(run=run, dir=str(run_dir), steps=manifest.steps, total=blob_count(manifest),
                          started_at=self.clock.wall(), moved=move)
        self.publications[run] = job
        self._nursery.start_soon(self._publish, manifest, run_dir, job)
        return job

    async def _publish(self, manifest: RunManifest, run_dir: Path, job: Publication) -> None:
        started = self.clock.now()

        def progress(done: int, total: int, note: str) -> None:
            job.done, job.total, job.note = done, total, note

        try:
            log.info("publishing run %s from %s: checking %d files", job.run[:16], run_dir, blob_count(manifest))
            job.bytes = await self.runfiles.import_dir(manifest, run_dir, progress, move=job.moved)
            self._nursery.start_soon(self._warm_chunk_tables, manifest)
            if job.moved:  # the run's files are the cache's now: challenges are answered from links to them
                run_dir = self.runfiles.assemble(manifest, run_blobs(manifest), purpose=PUBLISHED_DIR)
            await self.statements.add_run(manifest, run_dir)
            job.state, job.done = JobState.PROVIDING, 0
            if not self.bootstrapped.is_set():  # a hint, not a hang: unreachable bootstrap peers are retried
                job.note = "waiting to reach a bootstrap peer (see `open1b-node doctor`)"
                await self.bootstrapped.wait()
            blobs = run_blobs(manifest)
            progress(0, len(blobs), f"providing {len(blobs)} blobs")

            def provided(done: int, ok: bool) -> None:
                job.provided += ok
                progress(done, len(blobs), f"providing {len(blobs)} blobs")
            await provide_all(self.p2p, [blob.digest for blob in blobs], provided)
            job.state = JobState.ANNOUNCING
            progress(len(blobs), len(blobs), "gossiping the manifest")
            job.gossiped, why_not = await self._announce(manifest)
            job.state, job.note, job.seconds = JobState.DONE, why_not, round(self.clock.now() - started, 3)
            log.info("published run %s: %d blobs provided, manifest %s", job.run[:16], job.provided,
                     "gossiped" if job.gossiped else f"left to sync ({why_not})")
        except (Open1bError, OSError) as exc:
            job.state, job.error, job.seconds = JobState.FAILED, str(exc), round(self.clock.now() - started, 3)
            log.warning("publishing %s failed: %s", run_dir, exc)

    async def _warm_chunk_tables(self, manifest: RunManifest) -> None:
        """Compute every checkpoint's chunk table now, in the background, so that the first
        auditor to fetch one over the bulk path does not wait for the whole file to be hashed
        (docs/run-format.md §6.6; 2 s for a `gpt-125m` checkpoint)."""
        for digest in manifest.checkpoints:
            try:
                await self.runfiles.cache.chunk_table(digest)
            except (Open1bError, OSError) as exc:  # evicted, or not a checkpoint: served without a table
                log.warning("chunk table of checkpoint %s: %s", digest.hex()[:12], exc)

    async def _announce(self, manifest: RunManifest) -> tuple[bool, str]:
        """Gossip the manifest: (True, "") if it went to at least one peer, else (False, why)."""
        if len(manifest.encoded) > MAX_GOSSIP_MANIFEST:
            return False, "too large for gossip"
        if not self.p2p.connected_peers():
            return False, "no peers connected yet: peers get it by sync when they connect"
        await self.p2p.publish(RUNS_TOPIC, manifest.encoded)
        return True, ""
