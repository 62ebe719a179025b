"""The node's own spot checks: plan → fetch → challenge → check → sign → gossip (docs/protocol.md §5.5,
docs/run-format.md §10.2).

1. plan: :func:`~.spot_plan.next_spot_checks` over this key's secret order of the run's steps
   (:func:`~.spot_plan.spot_order`): the steps with the fewest counted spot checks first, never a
   step replay coverage verified, one this node checked, or one already failed;
2. fetch: the samples, checkpoints k and k+1 and ``fingerprints.cbor``
   (:meth:`~.fetcher.Fetcher.for_spot`), each verified against the manifest;
3. challenge: this node's signature over (run, k); the answer is asked of its peers, the run's
   publisher first, over the challenge stream (:mod:`.spot_answers`) for at most ``answer_s``
   seconds. The slot it recomputes comes from a second signature, revealed only in step 5;
4. check: in the replay worker (``check_spot``): the slot's loss and the loss sum while the answer
   is awaited, then the answer's chunks. An answer opens no commitment: its chunks bind whoever
   answered. So an answer that breaks a link, from a peer that is not the run's publisher, is only
   that peer's failure: the others are asked while time is left (docs/protocol.md §5.5). No answer
   is ``no_answer``;
5. sign the ``spotcheck`` (``pass`` or ``fail`` with the link ``caught``) and hand it to the
   outbox (stored, then gossiped: :mod:`.outbox`).

Runs whose manifest commits no fingerprints (no ``fingerprints_root``) are never spot checked
(:func:`why_not_spot_checked`). :meth:`SpotChecker.serve_spot_checker` runs one spot check at a
time beside the auditor's replays: waiting for an answer (up to ``ANSWER_SECONDS``) holds up no
replay, and both share the worker, one request at a time, in their own working directories.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
from pathlib import Path
from typing import Awaitable, Callable, Mapping

import trio

from open1b.protocol import Identity, RunManifest, SpotCheck, StepStatus, challenge_signature, slot_signature
from open1b.protocol.fingerprints import committed
from open1b.protocol.spotcheck import FAIL, PASS

from .blobs import provider_key
from .clock import Clock
from .config import NodeConfig
from .judge import Judge
from .metrics import NodeStats
from .outbox import Outbox
from .p2p import P2P
from .runs import FIND_PROVIDERS_TIMEOUT_S, RunFilesError, samples_blob, why_not_auditable
from .spot_answers import MAX_PENDING_ANSWERS, request_answer
from .spot_plan import next_spot_checks, spot_order
from .store import Store
from .worker import SPOT_ANSWER, SPOT_MICRO, ReplayFailed, ReplayWorker, SpotOutcome, WorkerStorageFull

log = logging.getLogger("open1b.node.spot_checker")

SPOT_RETRY_S = 10.0  # a step whose files could not be fetched is spot checked again after this long
# A lane with nothing to check looks again after this long: new work comes only with a new run, a
# retry (SPOT_RETRY_S) or a replay failing, and each look reads the run's coverage (0.1 s for a
# 256-step run on a loaded machine), which every idle lane of every daemon on the machine pays.
SPOT_IDLE_S = 2.0
ANSWERER_LINKS = ("proof", "update", "gradient", "sum")  # an answer's links: they bind only its answerer


def _scratch_failed(exc: OSError, path: Path) -> ReplayFailed:
    """A write to the spot checks' scratch directory that failed, as the worker's own failures are."""
    if exc.errno == errno.ENOSPC:
        return WorkerStorageFull(f"no space left on {path.parent}")
    return ReplayFailed(f"cannot write {path}: {exc.strerror}")


def why_not_spot_checked(manifest: RunManifest) -> str | None:
    """Why this node does not spot check the run (None: it does)."""
    if committed(manifest.data) is None:  # a decoded manifest's keys are well-formed (rule fingerprints)
        return "the run commits no fingerprints (docs/run-format.md §10.1)"
    return why_not_auditable(manifest)


Fetch = Callable[[RunManifest, int, int], Awaitable[tuple[Path, Callable[[], None]]]]


class SpotChecker:
    def __init__(self, identity: Identity, config: NodeConfig, p2p: P2P, worker: ReplayWorker, fetch: Fetch, *,
                 runs: Mapping[bytes, RunManifest], store: Store, judge: Judge, outbox: Outbox, clock: Clock,
                 stats: NodeStats, scratch: Path) -> None:
        """``fetch(manifest, step, lane)``: the working directory of ``lane`` with step k's
        spot-check files, and how to release them after (:meth:`~.fetcher.Fetcher.for_spot`);
        ``runs``, ``store``, ``judge``: what it plans from; ``outbox``: where its spot checks go."""
        self.identity, self.config, self.p2p, self.worker, self.fetch = identity, config, p2p, worker, fetch
        self.runs, self.store, self.judge, self.outbox = runs, store, judge, outbox
        self.clock, self.stats, self.scratch = clock, stats, scratch
        self._orders: dict[bytes, list[int]] = {}  # run -> this key's secret order of its steps
        self._own: dict[bytes, set[int]] = {}  # run -> steps this key has spot checked
        self._skip: dict[bytes, dict[int, float]] = {}  # run -> step -> clock.now() to retry after
        self._in_flight: dict[bytes, set[int]] = {}  # run -> steps a lane is checking now
        self._storage_full = False  # "storage full" is logged when this turns True, not on every check

    async def serve_spot_checker(self, *, bootstrapped: trio.Event, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Spot check, ``spot_checks_in_flight`` steps at a time, once bootstrap has pulled what
        peers hold; until cancelled."""
        task_status.started()
        await bootstrapped.wait()
        async with trio.open_nursery() as nursery:
            for lane in range(self.config.spot_checks_in_flight):
                nursery.start_soon(self._serve_lane, lane)

    async def _serve_lane(self, lane: int) -> None:
        while True:
            if not await self.check_once(lane):
                await self.clock.sleep(max(self.config.idle_poll_s, SPOT_IDLE_S))

    # -- 1. plan ---------------------------------------------------------------------------------
    def own_steps(self, run: bytes) -> set[int]:
        if run not in self._own:  # once per run from the store: what this key signed before a restart
            key = self.identity.public_key
            self._own[run] = {s.step for s in self.store.spotchecks(run) if s.signer == key}
        return self._own[run]

    def next_check(self, lane: int = 0) -> tuple[RunManifest, int] | None:
        """The next (run, step) for ``lane``. Lane 0 checks for as long as there are steps to
        check; the other lanes only take steps no one has spot checked yet: they speed up the first
        sweep over a run, which is what decides how soon a forged step is flagged, and then stand
        idle, so that checking steps again never takes more of the worker from replays than one lane."""
        now = self.clock.now()
        for run, manifest in self.runs.items():
            if why_not_spot_checked(manifest) is not None:
                continue
            replay = self.judge.coverage(run)
            verified = [s.step for s in replay.steps if s.status is StepStatus.VERIFIED]
            spot = self.judge.spot_coverage(run, replay)
            if run not in self._orders:
                self._orders[run] = spot_order(self.identity, run, manifest.steps)
            waiting = {k for k, t in self._skip.get(run, {}).items() if t > now} | self._in_flight.get(run, set())
            steps = next_spot_checks(self._orders[run], spot, self.own_steps(run) | waiting, verified, 1,
                                     unchecked_only=lane > 0)
            if steps:
                return manifest, steps[0]
        return None

    # -- 2.–5. ---------------------------------------------------------------------------------
    async def check_once(self, lane: int = 0) -> bool:
        """Spot check one step in ``lane``'s working directory; False if none is due."""
        picked = self.next_check(lane)
        if picked is None:
            return False
        manifest, step = picked
        in_flight = self._in_flight.setdefault(manifest.run_id, set())
        in_flight.add(step)  # no other lane picks it meanwhile
        try:
            return await self._check(manifest, step, lane)
        finally:
            in_flight.discard(step)

    async def _check(self, manifest: RunManifest, step: int, lane: int) -> bool:
        run = manifest.run_id
        started = self.clock.now()
        try:
            run_dir, release = await self.fetch(manifest, step, lane)
        except RunFilesError as exc:  # not a verdict: providers may appear; try again later
            self._skip.setdefault(run, {})[step] = self.clock.now() + SPOT_RETRY_S
            log.warning("spot check of step %d of %s: files unavailable: %s", step, run.hex()[:12], exc)
            return True
        fetched = self.clock.now()
        try:
            outcome = await self._challenge_and_check(manifest, step, run_dir)
        except WorkerStorageFull as exc:  # our disk, not the step: no verdict; try again later
            self._skip.setdefault(run, {})[step] = self.clock.now() + SPOT_RETRY_S
            if not self._storage_full:
                log.error("storage full: spot checks fail until there is room (%s)", exc)
            self._storage_full = True
            return True
        except ReplayFailed as exc:  # a broken worker or files: no verdict, and not retried
            self.stats.spot_failures += 1
            self._skip.setdefault(run, {})[step] = float("inf")
            log.warning("spot check of step %d of %s failed: %s", step, run.hex()[:12], exc)
            return True
        finally:
            release()
        self._storage_full = False
        # Where a spot check's time goes: what decides how fast spot checks sweep a run
        ended = self.clock.now()
        log.info("spot check of step %d of %s took %.2f s: files %.2f s, then the checks %.2f s (worker %.2f s)",
                 step, run.hex()[:12], ended - started, fetched - started, ended - fetched, outcome.elapsed_ms / 1000)
        await self._sign(manifest, step, outcome)
        return True

    async def _challenge_and_check(self, manifest: RunManifest, step: int, run_dir: Path) -> SpotOutcome:
        run = manifest.run_id
        challenges = (challenge_signature(self.identity, run, step), slot_signature(self.identity, run, step))
        deadline = self.clock.now() + self.config.answer_s
        tried: set[str] = set()
        got: tuple[str, bytes] | None = None

        async def ask() -> None:
            nonlocal got
            got = await request_answer(self.p2p, self._candidates(manifest), run, step, challenges[0],
                                       deadline_s=deadline - self.clock.now(), skip=tried, sleep=self.clock.sleep)

        try:
            self.scratch.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _scratch_failed(exc, self.scratch) from None
        recomputed = self.scratch / f"slot-{os.urandom(8).hex()}.f32"
        failure: ReplayFailed | None = None
        try:
            # The slot is checked while the answer is awaited: a trainer that stalls its answer (up to
            # ANSWER_SECONDS) delays no verdict the slot's loss decides, and an honest answer costs the
            # verifier no wall time beyond its own recomputation.
            async with trio.open_nursery() as nursery:
                nursery.start_soon(ask)
                try:
                    micro = await self.worker.spot(run_dir, step, challenges, None, recomputed,
                                                   timeout_s=self.config.replay_timeout_s, links=(SPOT_MICRO,))
                except ReplayFailed as exc:  # raised below: out of the nursery it would come wrapped in a group
                    failure = exc
                    nursery.cancel_scope.cancel()
                else:
                    if not micro.passed:
                        nursery.cancel_scope.cancel()
                        return micro
                checked = self.clock.now()
            if failure is not None:
                raise failure
            waited_s = self.clock.now() - checked
            spent_ms = micro.elapsed_ms
            if waited_s > 0.01:  # what the publisher's answer added to this check
                log.info("step %d of %s: the answer came %.2f s after the slot's check", step, run.hex()[:12], waited_s)
            while True:
                outcome = await self._check_answer(run_dir, step, challenges, got, recomputed)
                spent_ms += outcome.elapsed_ms
                if got is None or outcome.caught not in ANSWERER_LINKS or got[0] == manifest.signer_peer_id:
                    return dataclasses.replace(outcome, elapsed_ms=spent_ms)
                log.info("step %d of %s: %s, not the publisher, answered chunks that break %s", step, run.hex()[:12],
                         got[0], outcome.caught)
                tried.add(got[0])
                await ask()
        finally:
            recomputed.unlink(missing_ok=True)

    async def _check_answer(self, run_dir: Path, step: int, challenges: tuple[bytes, bytes],
                            got: tuple[str, bytes] | None, recomputed: Path) -> SpotOutcome:
        path = None
        if got is not None:
            path = self.scratch / f"check-{os.urandom(8).hex()}.cbor"
            try:
                await trio.to_thread.run_sync(path.write_bytes, got[1])
            except OSError as exc:
                path.unlink(missing_ok=True)
                raise _scratch_failed(exc, path) from None
        try:
            return await self.worker.spot(run_dir, step, challenges, path, recomputed,
                                          timeout_s=self.config.replay_timeout_s, links=(SPOT_ANSWER,))
        finally:
            if path is not None:
                path.unlink(missing_ok=True)

    def _candidates(self, manifest: RunManifest):
        """Who may answer: the run's publisher if connected (its answer binds it), the other
        connected peers, then the providers of the run's samples (every node that published the run
        provides them)."""
        p2p, publisher = self.p2p, manifest.signer_peer_id

        async def candidates() -> list[str]:
            peers = sorted(p2p.connected_peers(), key=lambda p: p != publisher)
            with trio.move_on_after(FIND_PROVIDERS_TIMEOUT_S):
                peers += [p for p in await p2p.find_providers(provider_key(samples_blob(manifest).digest))
                          if p not in peers and p != p2p.peer_id]
            return peers[:MAX_PENDING_ANSWERS * 8]
        return candidates

    async def _sign(self, manifest: RunManifest, step: int, outcome: SpotOutcome) -> None:
        sc = SpotCheck.create(
            self.identity, run=manifest.run_id, step=step, pre_state=manifest.state_hashes[step],
            fingerprint=outcome.fingerprint, challenge=challenge_signature(self.identity, manifest.run_id, step),
            slot_challenge=slot_signature(self.identity, manifest.run_id, step), slot=outcome.slot, chunks_total=outcome.chunks_total, chunks=list(outcome.chunks),
            verdict=PASS if outcome.passed else FAIL, caught=outcome.caught, engine=manifest.engine,
            engine_version=manifest.engine_version, device=outcome.device, elapsed_ms=outcome.elapsed_ms,
            issued_at=self.clock.wall())
        self.own_steps(manifest.run_id).add(step)
        self.stats.spot_checks[(sc.verdict, sc.caught)] += 1
        log.info("spot check of step %d of %s: %s (%s)", step, manifest.run_id.hex()[:12], sc.verdict, sc.caught)
        await self.outbox.publish(sc)
