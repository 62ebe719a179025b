"""The open1b-node daemon: only wiring. ``open_daemon()`` builds each component with all it needs
and serves it in one nursery; the data path runs through the components in one direction:

* :mod:`.ingest` — gossip and sync statements, validated, stored, judged (coverage, flags);
* :mod:`.publisher` — a run directory imported, its blobs provided, its manifest gossiped;
* :mod:`.auditor` — plan (:mod:`.planner`) → claim (:mod:`.claim_records`) → fetch (:mod:`.runs`,
  :mod:`.blobs`) → replay (:mod:`.worker`) → attest, back into ingest and onto gossip;
* :mod:`.spot_checker` — beside the replays, spot checks: plan, fetch, challenge, check, sign;
* :mod:`.spot_answers` — the challenge stream: answers to others' spot checks of runs published here;
* :mod:`.sync` — bootstrap, then periodic pulls from peers, and answers to theirs;
* :mod:`.evaluator` — its runs' evaluation results published, others' checked, the leaderboard;
* :mod:`.api_routes` — the local API and web page (:mod:`.api`, :mod:`.web`), and Prometheus
  metrics when configured.

Time and randomness are parameters (``clock``, ``rng``), so tests drive a whole node on trio's
``MockClock``. A test harness reaches the daemon only through :class:`Harness`; the daemon
imports nothing from ``node/devnet``.
"""

from __future__ import annotations

import logging
import random
import signal
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import AsyncIterator, Protocol

import trio

from open1b.deterministic.device import cpu_device_class
from open1b.protocol import Identity, Open1bError, RunManifest
from open1b.protocol.claims import CLAIM_NAMESPACE

from .api import serve_api
from .api_routes import Components, api_app, metrics_app
from .auditor import Auditor, Replayer, WorkerReplayer
from .blobs import BLOB_PROTOCOL, BlobCache
from .bulk import ADDRESS_PROTOCOL as BULK_ADDRESS_PROTOCOL
from .bulk import address_handler, serve_bulk
from .claim_records import ClaimAgent, ClaimRecords, DhtClaimBoard
from .clock import Clock
from .config import NodeConfig, split_hostport
from .datadir import DaemonLock, api_token, check_version, prepare_data_dir
from .evaluator import Evaluator
from .files import write_atomic
from .identity_file import load_or_create_identity
from .ingest import Ingest
from .metrics import NodeStats
from .p2p import P2P, open_p2p
from .publisher import Publisher, read_run_manifest
from .reachability import DIALBACK_PROTOCOL, DialBackServer, ReachabilityMonitor
from .runs import RunFiles, why_not_auditable
from .spot_answers import SPOTCHECK_PROTOCOL, AnswerServer
from .spot_checker import SpotChecker
from .store import STORE_FILE, Store
from .sync import Syncer
from .systemd import notify
from .topics import RUNS_TOPIC
from .worker import ReplayWorker

log = logging.getLogger("open1b.node")

API_ADDR_FILE = "api.addr"
P2P_ADDR_FILE = "p2p.addr"
BLOBS_DIR = "blobs"
SPOT_DIR = "spot"  # answers and checks in flight (files handed to and from the worker)


class Harness(Protocol):
    """The one hook a test harness has into a daemon (``node/devnet/adversaries.py`` implements it
    to make a devnet node misbehave on purpose). An honest daemon has none."""

    def replayer(self, honest: Replayer) -> Replayer:
        """What the auditor replays with, given the honest worker."""

    async def run(self, daemon: Daemon) -> None:
        """Behaviour of its own, started with the daemon's other tasks and cancelled with them."""


@dataclass(frozen=True)
class Daemon:
    """A running node's components (for the harness, tests and the CLI)."""

    identity: Identity
    config: NodeConfig
    clock: Clock
    p2p: P2P
    store: Store
    ingest: Ingest
    publisher: Publisher
    auditor: Auditor
    syncer: Syncer
    runfiles: RunFiles
    stats: NodeStats
    shutdown: trio.Event  # set by the API's /v1/shutdown
    api_port: int

    @property
    def bootstrapped(self) -> trio.Event:
        return self.syncer.bootstrapped


@asynccontextmanager
async def open_daemon(config: NodeConfig, *, clock: Clock, rng: random.Random,
                      harness: Harness | None = None) -> AsyncIterator[Daemon]:
    """Run a node for the duration of the block: its data dir locked, p2p listening, API served,
    every component serving. Leaving the block stops them all."""
    prepare_data_dir(config.data_dir)
    check_version(config.data_dir, create=True)
    identity = load_or_create_identity(config.data_dir)
    with DaemonLock(config.data_dir):
        store = Store(config.data_dir / STORE_FILE, now_ms=clock.wall_ms)
        worker = ReplayWorker(config.device)
        # A publisher's answers get their own worker process (started on the first challenge): an
        # answer is owed within ANSWER_SECONDS, and a replay of a real step can take that long, so
        # an honest trainer that also audits would otherwise miss its deadlines behind its replays.
        answer_worker = ReplayWorker(config.device)
        try:
            # an operator's local runs (--run): a bad manifest stops the daemon before it listens
            local_runs = [(d, read_run_manifest(d, clock.wall())) for d in (Path(r).resolve() for r in config.run_dirs)]
            async with open_p2p(identity, *split_hostport(config.listen), heartbeat_s=config.heartbeat_s,
                                max_rejects_per_peer=config.max_rejects_per_peer) as p2p:
                async with _serve(config, identity, store, (worker, answer_worker), p2p, local_runs, clock, rng,
                                  harness) as daemon:
                    yield daemon
        finally:
            await worker.aclose()
            await answer_worker.aclose()
            store.close()


@asynccontextmanager
async def _serve(config: NodeConfig, identity: Identity, store: Store, workers: tuple[ReplayWorker, ReplayWorker],
                 p2p: P2P, local_runs: list, clock: Clock, rng: random.Random,
                 harness: Harness | None) -> AsyncIterator[Daemon]:
    worker, answer_worker = workers  # replays and spot checks; answers to challenges
    stats = NodeStats()
    runfiles = RunFiles(config.data_dir, BlobCache(config.data_dir / BLOBS_DIR, config.blob_cache_bytes,
                                                    reserve_bytes=config.disk_reserve_bytes))
    ingest = Ingest(identity, config, store, p2p, clock=clock, stats=stats)
    for run, manifest in ingest.manifests.items():
        if store.run_dir(run) is not None and why_not_auditable(manifest) is None:
            runfiles.pin(manifest)  # runs we published: served for as long as we run
    syncer = Syncer(p2p, ingest, config, clock=clock, rng=rng, stats=stats)
    claims = ClaimAgent(identity, DhtClaimBoard(p2p), lease_s=config.lease_s, clock=clock.wall, sleep=clock.sleep,
                        seen=ingest.seen_claim, heard=store.slot_claims, rng=rng)
    p2p.register_record_validator(CLAIM_NAMESPACE, ClaimRecords())
    p2p.set_stream_handler(BLOB_PROTOCOL, runfiles.cache.serve)
    p2p.set_validator(RUNS_TOPIC, ingest.validate_gossip_manifest)
    await p2p.subscribe(RUNS_TOPIC, ingest.on_manifest)
    await ingest.join_known_runs()
    publisher = Publisher(ingest, runfiles, p2p, bootstrapped=syncer.bootstrapped, clock=clock)
    replayer: Replayer = WorkerReplayer(worker, config.replay_timeout_s)
    if harness is not None:
        replayer = harness.replayer(replayer)
    scratch = config.data_dir / SPOT_DIR
    answers = AnswerServer(answer_worker, ingest.manifests, store.run_dir, scratch, timeout_s=config.replay_timeout_s,
                           stats=stats)
    p2p.set_stream_handler(SPOTCHECK_PROTOCOL, answers.serve)
    auditor = Auditor(identity, config, ingest, claims, runfiles, p2p, replayer, bootstrapped=syncer.bootstrapped,
                      clock=clock, stats=stats)
    spot = SpotChecker(identity, config, ingest, p2p, worker, auditor.spot_files, clock=clock, stats=stats,
                       scratch=scratch)
    evaluator = Evaluator(store, identity, publish=p2p.publish, checkpoint=_checkpoint_of(auditor), now=clock.wall,
                          device=cpu_device_class(), policy=lambda: ingest.trust, redundancy=config.redundancy,
                          sleep=clock.sleep)
    shutdown = trio.Event()
    dialback = DialBackServer()
    p2p.set_stream_handler(DIALBACK_PROTOCOL, dialback.handle)
    reachability = ReachabilityMonitor(p2p, lambda: p2p.listen_port, rng, clock.sleep)
    node = Components(identity, config, p2p, ingest, publisher, auditor, runfiles, stats, worker, shutdown, evaluator,
                      reachability)
    addr_files = (config.data_dir / API_ADDR_FILE, config.data_dir / P2P_ADDR_FILE)
    async with trio.open_nursery() as nursery:
        await nursery.start(publisher.serve_publisher)
        await nursery.start(auditor.serve_auditor)
        if config.audit and config.spot_checks:
            await nursery.start(partial(spot.serve_spot_checker, bootstrapped=syncer.bootstrapped))
        if config.audit:  # the worker chooses and self-checks its device now, so status shows it
            nursery.start_soon(partial(worker.start, timeout_s=config.replay_timeout_s))
        for run_dir, manifest in local_runs:  # imported and announced like `publish` (its files are checked there)
            publisher.start_publish(run_dir, manifest)
        # Checkpoints travel on the bulk path, beside libp2p (docs/run-format.md §6.6).
        bulk_port = await nursery.start(partial(serve_bulk, runfiles.cache, identity, split_hostport(config.listen)[0], 0,
                                                allow=lambda peer: peer not in p2p.banned))
        p2p.set_stream_handler(BULK_ADDRESS_PROTOCOL, address_handler(bulk_port))
        api_host, api_port = split_hostport(config.api)
        api_port = await nursery.start(serve_api, api_host, api_port, api_app(node, token=api_token(config.data_dir)))
        if config.metrics:
            metrics_host, metrics_port = split_hostport(config.metrics)
            metrics_port = await nursery.start(partial(serve_api, metrics_host, metrics_port, metrics_app(node),
                                                       what="metrics"))
            log.info("metrics on http://%s:%d/metrics", metrics_host, metrics_port)
        write_atomic(addr_files[0], f"{api_host}:{api_port}\n".encode())
        write_atomic(addr_files[1], f"{p2p.addrs[0]}\n".encode())
        log.info("node %s listening on %s, API on %s:%d", p2p.peer_id, p2p.addrs[0], api_host, api_port)
        await nursery.start(syncer.serve_syncer)
        nursery.start_soon(partial(reachability.serve, ready=syncer.bootstrapped))
        await nursery.start(ingest.serve_judgements)
        await nursery.start(evaluator.serve_evaluator, config.audit)  # a node that audits nothing checks no result either
        daemon = Daemon(identity, config, clock, p2p, store, ingest, publisher, auditor, syncer, runfiles, stats,
                        shutdown, api_port)
        if harness is not None:
            nursery.start_soon(harness.run, daemon)
        try:
            yield daemon
        finally:
            nursery.cancel_scope.cancel()
    for path in addr_files:
        path.unlink(missing_ok=True)


def _checkpoint_of(auditor: Auditor):
    """The evaluator's way to a checkpoint: fetched and assembled as for a replay of that step,
    None while that fails (the evaluator tries again next round)."""
    async def checkpoint(manifest: RunManifest, state: int) -> Path | None:
        try:
            run_dir, _ = await auditor.run_files(manifest, state)
        except (Open1bError, OSError) as exc:
            log.info("evaluation of state %d of %s waits: %s", state, manifest.run_id.hex()[:16], exc)
            return None
        return run_dir
    return checkpoint


async def run_daemon(config: NodeConfig, *, harness: Harness | None = None) -> None:
    """``open1b-node daemon``: serve on the real clock until the API is asked to shut down or the
    process gets SIGTERM or SIGINT (``open1b-node stop``, systemd, Ctrl-C); either way the
    components stop cleanly and the address and lock files are removed."""
    try:
        async with open_daemon(config, clock=Clock(), rng=random.Random(), harness=harness) as daemon:
            notify("READY=1")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_shutdown_on_signal, daemon.shutdown)
                await daemon.shutdown.wait()
                nursery.cancel_scope.cancel()
            log.info("shutting down")
            notify("STOPPING=1")
    except BaseExceptionGroup as group:
        # a daemon that cannot start (its API port taken) says why in one line, not in nested nurseries
        leaves = _leaves(group)
        if len(leaves) == 1 and isinstance(leaves[0], Open1bError):
            raise leaves[0] from None
        raise
    log.info("stopped")


async def _shutdown_on_signal(shutdown: trio.Event) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("%s received: shutting down", signal.Signals(signum).name)
            shutdown.set()
            return


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]
