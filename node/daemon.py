"""The open1b-node daemon: only wiring. ``open_daemon()`` builds each component with all it needs
and serves it in one nursery; the data path runs through the components in one direction:

* :mod:`.ledger` — statements from gossip, sync and our own producers, validated and stored
  (:mod:`.statements`), then told one way to the judge (coverage, flags, earned trust:
  :mod:`.judge`, which sets what counts: :mod:`.counting`), the planner's view
  (:mod:`.planner_view`) and the replay proof; our own leave through the outbox (:mod:`.outbox`:
  stored, then gossiped);
* :mod:`.publisher` — a run directory imported, its blobs provided, its manifest gossiped;
* :mod:`.fetcher` — a run's files fetched, verified and assembled for replays, spot checks,
  evaluations and ``/v1/fetch``;
* :mod:`.auditor` — plan (:mod:`.planner_view`) → claim (:mod:`.claim_records`) → replay
  (:mod:`.fetcher`, :mod:`.worker`) → attest (into the outbox);
* :mod:`.spot_checker` — beside the replays, spot checks: plan, fetch, challenge, check, sign;
* :mod:`.spot_answers` — the challenge stream: answers to others' spot checks of runs published here;
* :mod:`.dispute_agent` — disputes over the steps whose results differ from ours, opened and
  answered on the dispute stream (:mod:`.disputes`), traced in the worker (:mod:`.dispute_tracer`);
* :mod:`.sync` — bootstrap, then periodic pulls from peers, and answers to theirs;
* :mod:`.fraud_proof_fetch` — the bodies of fraud proofs over the gossip bound, fetched by digest
  from the peer that announced them, and served to peers;
* :mod:`.evaluator` — its runs' evaluation results published, others' checked, the leaderboard;
* :mod:`.api_routes` — the local API and web page (:mod:`.api`, :mod:`.web`), and Prometheus
  metrics when configured.

Time and randomness are parameters (``clock``, ``rng``), and so are the network (``network``: what
opens the p2p node, :func:`~.p2p.open_p2p` by default) and what replays (``replayer``: the worker
process by default), so a test runs whole nodes on trio's ``MockClock`` over an in-memory network
(tests/node/test_whole_node.py). A test harness reaches the daemon only through :class:`Harness`;
the daemon imports nothing of the harness (``open1b.devnet``, ``open1b.sim``).
"""

from __future__ import annotations

import logging
import random
import signal
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import AsyncContextManager, AsyncIterator, Callable, Protocol

import trio

from open1b.deterministic.device import cpu_device_class
from open1b.protocol import Identity, Open1bError
from open1b.protocol.claims import CLAIM_NAMESPACE
from open1b.protocol.dispute.bisection import TRACE_TIMEOUT_S

from .api import serve_api
from .api_routes import Components, api_app, metrics_app
from .auditor import Auditor, Replayer, WorkerReplayer
from .blobs import BLOB_PROTOCOL, BlobCache
from .bulk import ADDRESS_PROTOCOL as BULK_ADDRESS_PROTOCOL
from .bulk import DIALBACK_PROTOCOL as BULK_DIALBACK_PROTOCOL
from .bulk import BulkServer, address_handler
from .claim_records import ClaimAgent, ClaimRecords, DhtClaimBoard
from .clock import Clock
from .config import NodeConfig, split_hostport
from .datadir import DaemonLock, api_token, check_version, prepare_data_dir
from .dispute_agent import DisputeAgent, DisputeInbox
from .dispute_exchange import Timing
from .dispute_tracer import Tracer, WorkerTracer
from .evaluator import Evaluator
from .fetcher import Fetcher
from .files import write_atomic
from .fraud_proof_fetch import SPOOL_DIR as PROOF_SPOOL_DIR
from .fraud_proof_fetch import ProofFetcher
from .identity_file import load_or_create_identity
from .ledger import Ledger, build_ledger
from .metrics import NodeStats
from .op_data import OpFiles
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
SPILL_DIR = "spill"  # the replay worker's spill files (unnamed: the directory stays empty)
DISPUTES_DIR = "disputes"  # disputes' op data (unnamed once the worker wrote it: node/op_data.py)

# What opens a node's p2p side: called as ``open_p2p`` is (identity, host, port, heartbeat_s=,
# max_rejects_per_peer=) and yields a P2P for the block.
Network = Callable[..., AsyncContextManager[P2P]]


class Harness(Protocol):
    """The one hook a test harness has into a daemon (``devnet/adversaries.py`` implements it
    to make a devnet node misbehave on purpose, and ``python -m open1b.devnet.daemon_entry`` hands
    it over). An honest daemon has none."""

    def replayer(self, honest: Replayer) -> Replayer:
        """What the auditor replays with, given the honest worker."""

    def tracer(self, honest: Tracer) -> Tracer:
        """What a dispute's traced replays are computed with, given the honest worker's."""

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
    ledger: Ledger
    publisher: Publisher
    fetcher: Fetcher
    auditor: Auditor
    syncer: Syncer
    disputes: DisputeAgent
    runfiles: RunFiles
    stats: NodeStats
    shutdown: trio.Event  # set by the API's /v1/shutdown
    api_port: int

    @property
    def bootstrapped(self) -> trio.Event:
        return self.syncer.bootstrapped


@asynccontextmanager
async def open_daemon(config: NodeConfig, *, clock: Clock, rng: random.Random,
                      harness: Harness | None = None, network: Network = open_p2p,
                      replayer: Replayer | None = None) -> AsyncIterator[Daemon]:
    """Run a node for the duration of the block: its data dir locked, p2p listening, API served,
    every component serving. Leaving the block stops them all. ``network`` opens the p2p node;
    ``replayer`` replays in place of the worker process (which then starts only when a spot check
    or an answer needs it)."""
    prepare_data_dir(config.data_dir)
    check_version(config.data_dir, create=True)
    identity = load_or_create_identity(config.data_dir)
    with DaemonLock(config.data_dir):
        store = Store(config.data_dir / STORE_FILE, now_ms=clock.wall_ms)
        worker = ReplayWorker(config.device, spill_dir=config.data_dir / SPILL_DIR)
        # A publisher's answers get their own worker process (started on the first challenge): an
        # answer is owed within ANSWER_SECONDS, and a replay of a real step can take that long, so
        # an honest trainer that also audits would otherwise miss its deadlines behind its replays.
        answer_worker = ReplayWorker(config.device)
        try:
            # an operator's local runs (--run): a bad manifest stops the daemon before it listens
            local_runs = [(d, read_run_manifest(d, clock.wall())) for d in (Path(r).resolve() for r in config.run_dirs)]
            async with network(identity, *split_hostport(config.listen), heartbeat_s=config.heartbeat_s,
                               max_rejects_per_peer=config.max_rejects_per_peer, relay_service=config.relay_service) as p2p:
                async with _serve(config, identity, store, (worker, answer_worker), p2p, local_runs, clock, rng,
                                  harness, replayer) as daemon:
                    yield daemon
        finally:
            for name in (API_ADDR_FILE, P2P_ADDR_FILE):  # also when a component failed: no stale addresses
                (config.data_dir / name).unlink(missing_ok=True)
            await worker.aclose()
            await answer_worker.aclose()
            store.close()


@asynccontextmanager
async def _serve(config: NodeConfig, identity: Identity, store: Store, workers: tuple[ReplayWorker, ReplayWorker],
                 p2p: P2P, local_runs: list, clock: Clock, rng: random.Random,
                 harness: Harness | None, replayer: Replayer | None) -> AsyncIterator[Daemon]:
    worker, answer_worker = workers  # replays and spot checks; answers to challenges
    stats = NodeStats()
    cache = BlobCache(config.data_dir / BLOBS_DIR, config.blob_cache_bytes, reserve_bytes=config.disk_reserve_bytes)
    # Checkpoints travel on the bulk path, beside libp2p (docs/run-format.md §6.6).
    bulk = BulkServer(cache, identity, allow=lambda peer: peer not in p2p.banned, penalise=p2p.penalise)
    runfiles = RunFiles(config.data_dir, cache, bulk)
    inbox = DisputeInbox()
    ledger = build_ledger(identity, config, store, p2p, clock=clock, stats=stats, listeners=(inbox.stored,) if config.disputes else ())
    statements, known = ledger.statements, ledger.manifests
    for run, manifest in known.items():
        if store.run_dir(run) is not None and why_not_auditable(manifest) is None:
            runfiles.pin(manifest)  # runs we published: served for as long as we run
    syncer = Syncer(p2p, statements, config, clock=clock, rng=rng, stats=stats)
    # fraud proofs over the gossip bound, by digest
    proofs = ProofFetcher(p2p, statements, ledger.outbox.regossip, config.data_dir / PROOF_SPOOL_DIR)
    claims = ClaimAgent(identity, DhtClaimBoard(p2p), lease_s=config.lease_s, clock=clock.wall, sleep=clock.sleep,
                        seen=statements.add_claim, heard=store.slot_claims, rng=rng)
    p2p.register_record_validator(CLAIM_NAMESPACE, ClaimRecords())
    p2p.set_stream_handler(BLOB_PROTOCOL, runfiles.cache.serve)
    p2p.set_validator(RUNS_TOPIC, statements.validate_gossip_manifest)
    await p2p.subscribe(RUNS_TOPIC, statements.on_manifest)
    await statements.join_known_runs()
    publisher = Publisher(statements, runfiles, p2p, bootstrapped=syncer.bootstrapped, clock=clock)
    fetcher = Fetcher(identity, runfiles, p2p)
    replays_in_worker = replayer is None
    if replayer is None:
        replayer = WorkerReplayer(worker, config.replay_timeout_s)
    if harness is not None:
        replayer = harness.replayer(replayer)
    scratch = config.data_dir / SPOT_DIR
    answers = AnswerServer(answer_worker, known, store.run_dir, scratch, timeout_s=config.replay_timeout_s,
                           stats=stats, penalise=p2p.penalise)
    p2p.set_stream_handler(SPOTCHECK_PROTOCOL, answers.serve)
    auditor = Auditor(identity, config, claims, fetcher, replayer, runs=known, planner=ledger.planner,
                      judge=ledger.judge, proof=ledger.proof, outbox=ledger.outbox, bootstrapped=syncer.bootstrapped,
                      clock=clock, stats=stats)
    spot = SpotChecker(identity, config, p2p, worker, fetcher.for_spot, runs=known, store=store, judge=ledger.judge,
                       outbox=ledger.outbox, clock=clock, stats=stats, scratch=scratch)
    evaluator = Evaluator(store, identity, outbox=ledger.outbox, checkpoint=fetcher.for_eval, now=clock.wall,
                          device=cpu_device_class(), policy=lambda: ledger.counting.trust,
                          redundancy=config.redundancy, sleep=clock.sleep)
    op_files = OpFiles(config.data_dir / DISPUTES_DIR)
    op_files.clear_leftovers()
    tracer = WorkerTracer(worker, scratch, config.replay_timeout_s, op_files)
    disputes = DisputeAgent(identity, p2p, harness.tracer(tracer) if harness is not None else tracer, inbox, runs=known,
                            store=store, counting=ledger.counting, fetcher=fetcher, publish=ledger.outbox.publish,
                            referee=statements.referee, clock=clock, rng=rng, stats=stats,
                            timing=Timing(config.dispute_round_s, trace_timeout_s=min(config.replay_timeout_s,
                                                                                      TRACE_TIMEOUT_S)))
    shutdown = trio.Event()
    dialback = DialBackServer(penalise=p2p.penalise)
    p2p.set_stream_handler(DIALBACK_PROTOCOL, dialback.handle)
    reachability = ReachabilityMonitor(p2p, lambda: p2p.listen_port, rng, clock.sleep)
    node = Components(identity, config, clock, p2p, ledger, publisher, fetcher, runfiles, stats, worker, shutdown,
                      evaluator, reachability)
    addr_files = (config.data_dir / API_ADDR_FILE, config.data_dir / P2P_ADDR_FILE)
    async with trio.open_nursery() as nursery:
        # after a referee change, the stored proofs are judged again meanwhile (not read out until then)
        await nursery.start(statements.referee.judge_stored_again, store.fraud, statements.tell)
        await nursery.start(fetcher.serve_fetcher)
        await nursery.start(proofs.serve_fetcher)
        await nursery.start(ledger.outbox.serve_outbox)
        await nursery.start(publisher.serve_publisher)
        await nursery.start(auditor.serve_auditor)
        if config.audit and config.spot_checks:
            await nursery.start(partial(spot.serve_spot_checker, bootstrapped=syncer.bootstrapped))
        if config.audit and replays_in_worker:  # the worker chooses and self-checks its device now, so status shows it
            nursery.start_soon(partial(worker.start, timeout_s=config.replay_timeout_s))
        for run_dir, manifest in local_runs:  # imported and announced like `publish` (its files are checked there)
            publisher.start_publish(run_dir, manifest)
        bulk_port = await nursery.start(bulk.serve, split_hostport(config.listen)[0], 0)
        p2p.set_stream_handler(BULK_ADDRESS_PROTOCOL, address_handler(bulk_port))
        p2p.set_stream_handler(BULK_DIALBACK_PROTOCOL, bulk.dial_back)
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
        await nursery.start(ledger.judge.serve_judge)
        await nursery.start(partial(ledger.proof.serve_reveals, ledger.outbox.publish, clock=clock))
        await nursery.start(evaluator.serve_evaluator, config.audit)  # a node that audits nothing checks no result either
        if config.disputes:
            await nursery.start(disputes.serve_disputes)
        daemon = Daemon(identity, config, clock, p2p, store, ledger, publisher, fetcher, auditor, syncer, disputes,
                        runfiles, stats, shutdown, api_port)
        if harness is not None:
            nursery.start_soon(harness.run, daemon)
        try:
            yield daemon
        finally:
            nursery.cancel_scope.cancel()


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
