"""The auditor: plan → claim → fetch → replay → attest, one step at a time.

1. plan: ask the planner (:func:`~.planner.pick`) for the steps this node should replay next,
   from ingest's incremental indexes (:class:`~.deficits.RunIndexes`), skipping steps it attested,
   whose replay failed here, or whose files are in back-off; steps a counted spot check failed
   come first (:func:`~.planner.pick_first`). Spot checks (:mod:`.spot_checker`) run beside the
   replays: they share the worker (one request at a time) and fetch through :meth:`Auditor.spot_files`;
2. claim: take a redundancy slot through the DHT (:class:`~.claim_records.ClaimAgent`), held for
   as long as fetching and replaying take;
3. fetch: the samples file, then checkpoint k (over the bulk path when a provider serves it
   there, each chunk checked against h_k), from providers, verified against the manifest
   (:class:`~.runs.RunFiles`), and announce what we now hold;
4. replay: through a :class:`Replayer` — the worker process (:class:`WorkerReplayer`), or what a
   test harness puts in its place;
5. attest: compare with the manifest, sign, store and gossip (:meth:`~.ingest.Ingest.publish_own_attestation`),
   and remember the replay's witness for the proof of replay.
"""

from __future__ import annotations

import functools
import logging
import platform
from pathlib import Path
from typing import Awaitable, Callable, Protocol

import trio

from open1b.protocol import MATCH, MISMATCH, Attestation, Claim, Identity, RunManifest
from open1b.protocol.witness import witness_binding

from . import planner
from .claim_records import ClaimAgent
from .clock import Clock
from .config import NodeConfig
from .ingest import Ingest
from .metrics import NodeStats
from .p2p import P2P, NetworkError
from .runs import (
    FIND_PROVIDERS_TIMEOUT_S,
    BulkFetch,
    NoRoomForRunFiles,
    RunBlob,
    RunFiles,
    RunFilesError,
    checkpoint_blob,
    fingerprints_blob,
    samples_blob,
    why_not_auditable,
)
from .topics import attestations_topic
from .worker import ReplayFailed, ReplayWorker, WorkerResult

log = logging.getLogger("open1b.node.auditor")

SPOT_DIR = "spot"  # the spot checker's working directory beside the replay's (RunFiles.work_dir)

FETCH_RETRY_S = 10.0  # a step whose files could not be fetched is retried after this long
CLAIM_TRIES = 4  # candidates tried per round before idling


class Replayer(Protocol):
    """The hook between the auditor and whatever recomputes a step. The daemon's own is the worker
    process; a test harness (``node/devnet/adversaries.py``) may wrap it to misbehave on purpose."""

    async def replay(self, manifest: RunManifest, run_dir: Path, step: int) -> WorkerResult:
        """Recompute ``step`` of ``manifest`` from the files in ``run_dir``; :class:`ReplayFailed` if it cannot."""


class WorkerReplayer:
    """Replays in the separate worker process (:mod:`.worker`), bounded by the config's timeout."""

    def __init__(self, worker: ReplayWorker, timeout_s: float) -> None:
        self.worker, self.timeout_s = worker, timeout_s

    async def replay(self, manifest: RunManifest, run_dir: Path, step: int) -> WorkerResult:
        return await self.worker.replay(run_dir, step, timeout_s=self.timeout_s)


def hardware_description() -> str:
    return f"{platform.machine()} {platform.system()} numba-cpu"


class Auditor:
    def __init__(self, identity: Identity, config: NodeConfig, ingest: Ingest, claims: ClaimAgent, runfiles: RunFiles,
                 p2p: P2P, replayer: Replayer, *, bootstrapped: trio.Event, clock: Clock, stats: NodeStats) -> None:
        self.identity, self.config, self.ingest, self.claims = identity, config, ingest, claims
        self.runfiles, self.p2p, self.replayer = runfiles, p2p, replayer
        self.bootstrapped, self.clock, self.stats = bootstrapped, clock, stats
        self.hardware = hardware_description()
        self._failed: dict[bytes, set[int]] = {}  # steps whose replay failed here; not retried
        self._fetch_backoff: dict[tuple[bytes, int], float] = {}  # (run, step) -> retry after (clock.now())
        self._no_room = False  # the last fetch found the disk full: said once, not for every step tried
        self._nursery: trio.Nursery | None = None

    async def serve_auditor(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Announce fetched blobs in the background; audit (when the config says so) until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            if not self.config.audit:
                await trio.sleep_forever()
            await self.bootstrapped.wait()
            while True:
                if not await self.audit_once():
                    await self.clock.sleep(self.config.idle_poll_s)

    # -- 1. plan -------------------------------------------------------------------------------
    def next_candidates(self) -> list[tuple[RunManifest, planner.Candidate]]:
        # Incremental (node/deficits.py): no pass over every step or every stored attestation.
        out = []
        now = self.clock.now()
        deficits = self.ingest.deficits
        for run, manifest in self.ingest.manifests.items():
            if why_not_auditable(manifest) is not None:
                continue  # a node runs only its own engine
            index = deficits.index(run)
            done_here = index.mine | self._failed.get(run, set())
            done_here = done_here | {s for (r, s), t in self._fetch_backoff.items() if r == run and t > now}
            first = planner.pick_first(index, deficits.order(run), self.ingest.spot_failed(run), exclude=done_here)
            out += [(manifest, cand, 0) for cand in first]
            out += [(manifest, cand, 1) for cand in planner.pick(index, deficits.order(run),
                                                                 exclude=done_here | {c.step for c in first})]
        return [(m, c) for m, c, _ in sorted(out, key=lambda item: (item[2], item[1].order()))]

    # -- 2. claim ------------------------------------------------------------------------------
    async def audit_once(self) -> bool:
        """Claim one step and replay it; False if no step could be claimed."""
        picked = None
        for manifest, cand in self.next_candidates()[:CLAIM_TRIES]:
            try:
                claim = await self.claims.try_claim(manifest.run_id, cand)
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
                    run_dir, blobs = await self.run_files(manifest, step)
                    result = await self.replayer.replay(manifest, run_dir, step)
                except ReplayFailed as exc:  # caught in here: a nursery would wrap it in a group
                    failure = exc
                except RunFilesError as exc:
                    unavailable = exc
                nursery.cancel_scope.cancel()
        finally:
            self.stats.busy_step = None
            if blobs:
                self.runfiles.release(manifest, blobs[1:])  # keep samples.bin, drop the checkpoint link
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
        self.stats.replay_device = result.device
        self.stats.replayed.append((manifest.run_id.hex(), step))
        await self._attest(manifest, step, result)

    # -- 3. fetch ------------------------------------------------------------------------------
    async def run_files(self, manifest: RunManifest, step: int) -> tuple[Path, list[RunBlob]]:
        """Fetch (or find in the cache) what replaying ``step`` needs and assemble the working directory."""
        samples, checkpoint = samples_blob(manifest), checkpoint_blob(manifest, step)
        await self.runfiles.fetch(self.p2p, samples, on_bad_peer=self.p2p.penalise, provide=self._provide_soon)
        # the samples first: the bulk path checks the checkpoint's chunks against h_k, whose
        # preimage includes the batch step k-1 consumed, recomputed from them
        self.runfiles.assemble(manifest, [samples])
        await self.runfiles.fetch(self.p2p, checkpoint, on_bad_peer=self.p2p.penalise, provide=self._provide_soon,
                                  bulk=BulkFetch(self.identity, manifest, step))
        return self.runfiles.assemble(manifest, [checkpoint]), [samples, checkpoint]

    async def spot_files(self, manifest: RunManifest, step: int, lane: int = 0) -> tuple[Path, Callable[[], None]]:
        """What a spot check of ``step`` needs (docs/run-format.md §10.2): the samples, checkpoints k
        and k+1 and the run's fingerprints, each verified as it is fetched, linked into the working
        directory of the spot checker's ``lane`` (replays and the other lanes release theirs
        meanwhile: checks of steps k and k+1 share a checkpoint); and how to release them."""
        samples, before, after = samples_blob(manifest), checkpoint_blob(manifest, step), checkpoint_blob(manifest, step + 1)
        await self.runfiles.fetch(self.p2p, samples, on_bad_peer=self.p2p.penalise, provide=self._provide_soon)
        self.runfiles.assemble(manifest, [samples])  # the bulk path reads them from the replay's directory
        # The three at once: a small blob's fetch is mostly round trips (asking peers, a bulk
        # handshake), which overlap; each is verified on its own.
        fetches = [functools.partial(self.runfiles.fetch, self.p2p, blob, on_bad_peer=self.p2p.penalise,
                                     provide=self._provide_soon, bulk=BulkFetch(self.identity, manifest, k))
                   for k, blob in ((step, before), (step + 1, after))]
        fetches.append(functools.partial(self.runfiles.fetch_fingerprints, self.p2p, manifest,
                                         on_bad_peer=self.p2p.penalise, provide=self._provide_soon))
        await _all_or_first_error(fetches)
        fingerprints = fingerprints_blob(manifest)
        assert fingerprints is not None  # fetch_fingerprints raised otherwise
        purpose = f"{SPOT_DIR}{lane}"
        run_dir = self.runfiles.assemble(manifest, [samples, before, after, fingerprints], purpose=purpose)
        # keep samples.bin and fingerprints.cbor (every check reads them), drop the checkpoint links
        return run_dir, lambda: self.runfiles.release(manifest, [before, after], purpose=purpose)

    def _provide_soon(self, key: str) -> None:
        """Announce a blob we now hold without holding up the replay that fetched it (a DHT
        provide can take seconds, and up to its timeout when peers are unreachable)."""
        if self._nursery is None:
            raise RuntimeError("fetch before serve_auditor started")
        p2p = self.p2p

        async def provide() -> None:
            with trio.move_on_after(FIND_PROVIDERS_TIMEOUT_S):
                await p2p.provide(key)

        self._nursery.start_soon(provide)

    # -- 5. attest -----------------------------------------------------------------------------
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
        self.ingest.proof.replayed(manifest, step, result.post_state, result.witness)
        self.ingest.add_own_attestation(att)
        log.info("step %d of run %s: %s (%d ms)", step, manifest.run_id.hex()[:12], att.verdict, result.elapsed_ms)
        await self.p2p.publish(attestations_topic(manifest.run_id), att.encoded)


async def _all_or_first_error(fetches: list[Callable[[], Awaitable[object]]]) -> None:
    """Run ``fetches`` at once; if any failed with :class:`RunFilesError`, raise the first (plain,
    as one sequential fetch would), once all have finished."""
    errors: list[RunFilesError] = []

    async def one(fetch: Callable[[], Awaitable[object]]) -> None:
        try:
            await fetch()
        except RunFilesError as exc:
            errors.append(exc)

    async with trio.open_nursery() as nursery:
        for fetch in fetches:
            nursery.start_soon(one, fetch)
    if errors:
        raise errors[0]
