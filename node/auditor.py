"""The auditor: plan → claim → replay → attest, one step at a time.

1. plan: ask the planner (:func:`~.planner.pick`) for the steps this node should replay next,
   from the planner's view (:class:`~.planner_view.PlannerView`), skipping steps it attested,
   whose replay failed here, or whose files are in back-off; steps a counted spot check failed
   come first (:func:`~.planner.pick_first`, from the judge);
2. claim: take a redundancy slot through the DHT (:class:`~.claim_records.ClaimAgent`), held for
   as long as fetching and replaying take;
3. replay: the step's files from the fetcher (:meth:`~.fetcher.Fetcher.for_replay`), recomputed
   through a :class:`Replayer` — the worker process (:class:`WorkerReplayer`), or what a test
   harness puts in its place;
4. attest: compare with the manifest, remember the replay's witness for the proof of replay
   (:meth:`~.replay_proof.ReplayProof.replayed`), sign, and hand the attestation to the outbox
   (stored, then gossiped: :mod:`.outbox`).
"""

from __future__ import annotations

import logging
import platform
from pathlib import Path
from typing import Mapping, Protocol

import trio

from open1b.protocol import MATCH, MISMATCH, Attestation, Claim, Identity, RunManifest
from open1b.protocol.witness import witness_binding

from . import planner
from .claim_records import ClaimAgent
from .clock import Clock
from .config import NodeConfig
from .fetcher import Fetcher
from .judge import Judge
from .metrics import NodeStats
from .outbox import Outbox
from .p2p import NetworkError
from .planner import ReplayEstimate
from .planner_view import PlannerView
from .replay_proof import ReplayProof
from .runs import NoRoomForRunFiles, RunBlob, RunFilesError, why_not_auditable
from .worker import ReplayFailed, ReplayWorker, WorkerResult

log = logging.getLogger("open1b.node.auditor")

FETCH_RETRY_S = 10.0  # a step whose files could not be fetched is retried after this long
# The first claim waits for the replayer this long at most (a worker's start and self-checks took
# 25 s at load 12 in a devnet, a cold one's 24 s at load 5): then it claims with its class unknown,
# as a node did before it waited at all, rather than audit nothing while a start hangs.
READY_WAIT_S = 120.0
CLAIM_TRIES = 4  # candidates tried per round before idling


class Replayer(Protocol):
    """The hook between the auditor and whatever recomputes a step. The daemon's own is the worker
    process; a test harness (``devnet/adversaries.py``) may wrap it to misbehave on purpose."""

    async def replay(self, manifest: RunManifest, run_dir: Path, step: int) -> WorkerResult:
        """Recompute ``step`` of ``manifest`` from the files in ``run_dir``; :class:`ReplayFailed` if it cannot."""

    def device_class(self) -> str | None:
        """The device class it replays on, once known (None before): the class preference keys on
        it from the node's first replay on, not only from its second."""

    async def ready(self) -> None:
        """Returns once it can replay and :meth:`device_class` is known (the worker has chosen and
        self-checked its device), or once it is known that it cannot yet (the worker did not start):
        the auditor claims nothing before (for READY_WAIT_S at most), so that every claim names its
        class and no lease runs while the worker starts."""


class WorkerReplayer:
    """Replays in the separate worker process (:mod:`.worker`), bounded by the config's timeout."""

    def __init__(self, worker: ReplayWorker, timeout_s: float) -> None:
        self.worker, self.timeout_s = worker, timeout_s

    async def replay(self, manifest: RunManifest, run_dir: Path, step: int) -> WorkerResult:
        return await self.worker.replay(run_dir, step, timeout_s=self.timeout_s)

    def device_class(self) -> str | None:
        return self.worker.device  # from the worker's hello, sent once its device is chosen

    async def ready(self) -> None:
        # The daemon starts the worker at once (node/daemon.py); this waits for that start to end,
        # its device chosen and self-checked, or failed (logged; the first replay tries again). It
        # starts nothing itself: a second start after a failed one is another cold start, and a
        # start's timeout kills whatever process the worker holds.
        await self.worker.start_ended.wait()


def hardware_description() -> str:
    return f"{platform.machine()} {platform.system()} numba-cpu"


class Auditor:
    def __init__(self, identity: Identity, config: NodeConfig, claims: ClaimAgent, fetcher: Fetcher,
                 replayer: Replayer, *, runs: Mapping[bytes, RunManifest], planner: PlannerView, judge: Judge,
                 proof: ReplayProof, outbox: Outbox, bootstrapped: trio.Event, clock: Clock,
                 stats: NodeStats) -> None:
        """``runs``: the runs this node knows; ``planner`` and ``judge``: what it plans from;
        ``proof`` and ``outbox``: where a replay's witness and attestation go."""
        self.identity, self.config, self.claims, self.fetcher, self.replayer = identity, config, claims, fetcher, replayer
        self.runs, self.planner, self.judge, self.proof, self.outbox = runs, planner, judge, proof, outbox
        self.bootstrapped, self.clock, self.stats = bootstrapped, clock, stats
        self.hardware = hardware_description()
        self._failed: dict[bytes, set[int]] = {}  # steps whose replay failed here; not retried
        self._fetch_backoff: dict[tuple[bytes, int], float] = {}  # (run, step) -> retry after (clock.now())
        self._no_room = False  # the last fetch found the disk full: said once, not for every step tried
        # This node's replay time, refined by every replay; claims carry it (docs/protocol.md §10.1).
        self.estimate = ReplayEstimate()
        self.device: str | None = None  # the device class of its last replay: the class preference's key

    async def serve_auditor(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Audit (when the config says so) until cancelled."""
        task_status.started()
        if not self.config.audit:
            return
        await self.bootstrapped.wait()
        # A claim names its claimant's class (docs/protocol.md §10.1: the class wait reads a replay
        # in flight as its claim's class). A node bootstraps and learns its runs long before its
        # worker has self-checked its device (25 s at load 12 in a devnet): its first claims
        # carried no class, and their leases ran while the worker started.
        with trio.move_on_after(READY_WAIT_S) as waiting:
            await self.replayer.ready()
        if waiting.cancelled_caught:
            log.warning("the replayer is not ready after %.0f s: claiming with the device class unknown", READY_WAIT_S)
        while True:
            if not await self.audit_once():
                await self.clock.sleep(self.config.idle_poll_s)

    # -- 1. plan -------------------------------------------------------------------------------
    def next_candidates(self) -> list[tuple[RunManifest, planner.Candidate]]:
        # Incremental (node/deficits.py): no pass over every step or every stored attestation.
        out = []
        now = self.clock.now()
        view = self.planner
        for run, manifest in self.runs.items():
            if why_not_auditable(manifest) is not None:
                continue  # a node runs only its own engine
            index = view.index(run)
            done_here = index.mine | self._failed.get(run, set())
            done_here = done_here | {s for (r, s), t in self._fetch_backoff.items() if r == run and t > now}
            first = planner.pick_first(index, view.order(run), self.judge.spot_failed(run), exclude=done_here)
            out += [(manifest, cand, 0) for cand in first]
            out += [(manifest, cand, 1) for cand in planner.plan(index, view.order(run), now=index.now,
                                                                 exclude=done_here | {c.step for c in first},
                                                                 device=self.device or self.replayer.device_class(),
                                                                 estimate_s=self.estimate.seconds)]
        return [(m, c) for m, c, _ in sorted(out, key=lambda item: (item[2], item[1].order()))]

    def _class_wait(self, run: bytes):
        """try_claim's ``waits``: the class wait over the planner's view, as it stands once the
        claims try_claim read are stored."""
        device = self.device or self.replayer.device_class()
        return lambda step: step in self.planner.index(run).class_wait(device)

    # -- 2. claim ------------------------------------------------------------------------------
    async def audit_once(self) -> bool:
        """Claim one step and replay it; False if no step could be claimed."""
        picked = None
        for manifest, cand in self.next_candidates()[:CLAIM_TRIES]:
            try:
                claim = await self.claims.try_claim(manifest.run_id, cand, estimate_s=self.estimate.seconds,
                                                    waits=self._class_wait(manifest.run_id),
                                                    device=self.device or self.replayer.device_class())
            except NetworkError as exc:  # the DHT did not take the claim: as good as lost, try the next
                log.info("claiming step %d of run %s failed: %s", cand.step, manifest.run_id.hex()[:12], exc)
                continue
            if claim is not None:
                picked = (manifest, claim)
                break
        self.stats.claims_won, self.stats.claims_lost = self.claims.won, self.claims.lost
        if picked is None:
            return False
        await self._replay_and_attest(*picked)
        return True

    async def _replay_and_attest(self, manifest: RunManifest, claim: Claim) -> None:
        step = claim.step
        self.stats.busy_step = step
        started = self.clock.now()
        failure: ReplayFailed | None = None
        unavailable: RunFilesError | None = None
        blobs: list[RunBlob] = []
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.claims.hold, claim)  # fetching and replaying may outlast one lease
                try:
                    run_dir, blobs = await self.fetcher.for_replay(manifest, step)
                    result = await self.replayer.replay(manifest, run_dir, step)
                except ReplayFailed as exc:  # caught in here: a nursery would wrap it in a group
                    failure = exc
                except RunFilesError as exc:
                    unavailable = exc
                nursery.cancel_scope.cancel()
        finally:
            self.stats.busy_step = None
            if blobs:
                self.fetcher.release(manifest, blobs)
        if unavailable is not None:
            # Not a verdict and not permanent: providers may appear (or stop lying). Retry later.
            self._fetch_backoff[(manifest.run_id, step)] = self.clock.now() + FETCH_RETRY_S
            no_room = isinstance(unavailable, NoRoomForRunFiles)
            if no_room and not self._no_room:
                log.warning("storage full: replays wait for room on the disk (%s)", unavailable)
            elif not no_room:
                log.warning("step %d of run %s: files unavailable: %s", step, manifest.run_id.hex()[:12], unavailable)
            self._no_room = no_room
            return
        if self._no_room:
            log.info("storage has room again: replaying")
            self._no_room = False
        if failure is not None:
            self.stats.replay_failures += 1
            self._failed.setdefault(manifest.run_id, set()).add(step)
            log.warning("replay of step %d failed: %s", step, failure)
            return
        self.stats.record_replay(self.clock.now() - started)
        # the replay's own time, as its attestation reports it (elapsed_ms): what the tail rules compare
        # with the network's typical time, which attestations report the same way (docs/protocol.md §10.1)
        self.estimate.update(result.elapsed_ms / 1000)
        self.stats.replay_device = self.device = result.device
        self.stats.replayed.append((manifest.run_id.hex(), step))
        await self._attest(manifest, step, result)

    # -- 4. attest -----------------------------------------------------------------------------
    async def _attest(self, manifest: RunManifest, step: int, result: WorkerResult) -> None:
        if result.pre_state != manifest.state_hashes[step]:
            # The worker checked this already; a difference means a broken worker, not a verdict.
            self._failed.setdefault(manifest.run_id, set()).add(step)
            log.error("worker reported a foreign pre-state for step %d; not attesting", step)
            return
        expected = manifest.state_hashes[step + 1]
        att = Attestation.create(
            self.identity, run=manifest.run_id, step=step, pre_state=result.pre_state,
            post_state=result.post_state, verdict=MATCH if result.post_state == expected else MISMATCH,
            engine=manifest.engine, engine_version=manifest.engine_version, hardware=self.hardware,
            device=result.device, elapsed_ms=result.elapsed_ms, issued_at=self.clock.wall(),
            witness=witness_binding(manifest.run_id, step, self.identity.public_key, result.witness),
        )
        # The witness first: storing the attestation marks the run for judging (earned trust reads both).
        self.proof.replayed(manifest, step, result.post_state, result.witness)
        log.info("step %d of run %s: %s (%d ms)", step, manifest.run_id.hex()[:12], att.verdict, result.elapsed_ms)
        await self.outbox.publish(att)

