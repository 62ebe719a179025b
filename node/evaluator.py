"""The node's evaluation component (docs/run-format.md §9, docs/protocol.md §8.5–§8.6): it takes
``eval`` statements from gossip, publishes its own runs' results, checks other publishers' results
by recomputing them, and serves the leaderboard.

It is built with everything it needs — the store, the node key, the outbox its statements leave
by (:mod:`.outbox`: stored, then gossiped), a ``checkpoint(manifest, k)`` async context that holds a run
directory with checkpoint k while a check lasts (or gives None while it cannot), a clock (``now()``, ``sleep``) and the trust policy (read at each use: earned trust changes it while the daemon runs) — and
serves itself with :meth:`Evaluator.serve_evaluator`; :mod:`.statements` takes ``eval`` statements from
gossip into the store, where this component finds them, and the daemon adds :meth:`routes` to
the API.
"""

from __future__ import annotations

import logging
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Awaitable, Callable

import trio

from open1b.deterministic.runfile import EVALUATIONS_FILE
from open1b.protocol import EvalStatement, Identity, Open1bError, RunManifest, TrustPolicy, validate_eval
from open1b.protocol.evaluation import RESULT, eval_schedule, evaluations
from open1b.protocol.validation import Verdict

from .api import ApiError
from .evaluations import board, check_result, sign_results
from .outbox import StatementOutbox
from .runs import why_not_auditable
from .store import Store

log = logging.getLogger(__name__)

Checkpoint = Callable[[RunManifest, int], AbstractAsyncContextManager["Path | None"]]


class Evaluator:
    def __init__(self, store: Store, identity: Identity, *, outbox: StatementOutbox, checkpoint: Checkpoint,
                 now: Callable[[], int], device: str, policy: Callable[[], TrustPolicy], redundancy: int,
                 interval: float = 10.0, sleep: Callable[[float], Awaitable[None]] = trio.sleep) -> None:
        self.store, self.identity, self.outbox, self.checkpoint = store, identity, outbox, checkpoint
        self.now, self.device, self.policy, self.redundancy, self.interval = now, device, policy, redundancy, interval
        self.sleep = sleep  # a clock's sleep: tests drive the loop on virtual time
        self.checked = 0  # results this node recomputed
        self._failed: set[bytes] = set()  # results whose check failed here (logged): not retried

    def _run(self, run_id: bytes) -> RunManifest | None:
        return next((m for m in self.store.manifests() if m.run_id == run_id), None)

    def validate(self, data: bytes) -> Verdict[EvalStatement]:
        """§7's rules for an ``eval`` against the runs this node knows."""
        return validate_eval(data, self._run, self.now())


    async def publish_results(self, manifest: RunManifest, run_dir: Path) -> int:
        """Sign and gossip the results of a run this node published (``RUN/evaluations.cbor``);
        nothing for a run without an evaluation schedule or that another key published."""
        if not eval_schedule(manifest) or manifest.publisher != self.identity.public_key:
            return 0
        results = sign_results(run_dir, manifest, self.identity, device=self.device, now=self.now())
        for r in results:
            await self.outbox.publish(r)
        return len(results)

    async def publish_own_results(self) -> int:
        """:meth:`publish_results` for every run this node published (the store knows its
        directory) whose results are not stored yet: a run is published before it is evaluated
        here, and this runs each round, so a restart or a late ``evaluations.cbor`` is caught up."""
        done = 0
        for manifest in self.store.manifests():
            run_dir = self.store.run_dir(manifest.run_id)
            if (run_dir is None or manifest.publisher != self.identity.public_key or not eval_schedule(manifest)
                    or not (Path(run_dir) / EVALUATIONS_FILE).exists()):
                continue
            if any(e.verdict == RESULT for e in self.store.evals(manifest.run_id)):
                continue
            try:
                done += await self.publish_results(manifest, run_dir)
            except (Open1bError, ValueError) as exc:
                log.warning("cannot publish the evaluation results of %s: %s", manifest.run_id.hex()[:16], exc)
        return done

    def pending(self, manifest: RunManifest) -> list[EvalStatement]:
        """The run's results this node has not checked yet (one per state: a second result of a
        state is the publisher's contradiction, already a dispute, and needs no replay)."""
        if manifest.publisher == self.identity.public_key or why_not_auditable(manifest) is not None:
            return []  # a node runs only its own engine, and a trainer does not check itself
        held = self.store.evals(manifest.run_id)
        mine = {(e.state, e.claimed) for e in held if e.signer == self.identity.public_key}
        results = {}
        for e in held:
            if e.verdict == RESULT:
                results.setdefault(e.state, []).append(e)
        return [rs[0] for k, rs in sorted(results.items())
                if len(rs) == 1 and (k, rs[0].loss) not in mine and rs[0].digest not in self._failed]

    async def check_pending(self) -> int:
        """Recompute every pending result whose checkpoint is at hand (off the event loop) and
        gossip a match or mismatch of it; returns how many it checked."""
        done = 0
        for manifest in self.store.manifests():
            for result in self.pending(manifest):
                async with self.checkpoint(manifest, result.state) as run_dir:
                    if run_dir is None:
                        continue  # the checkpoint cannot be fetched now: try again next round
                    try:
                        check = await trio.to_thread.run_sync(lambda: check_result(
                            run_dir, manifest, result, self.identity, device=self.device, now=self.now()))
                    except (Open1bError, ValueError, OSError) as exc:
                        # e.g. the shipped corpus does not give the run's eval_root: no loss to sign
                        log.warning("cannot check the evaluation of state %d of %s: %s", result.state,
                                    manifest.run_id.hex()[:16], exc)
                        self._failed.add(result.digest)
                        continue
                await self.outbox.publish(check)
                done += 1
        self.checked += done
        return done

    async def republish(self) -> int:
        """Gossip again every stored ``eval`` of a run whose evaluations are not all settled
        (certified or disputed): statements carry no sync protocol yet (docs/protocol.md §16), so
        a node that joined the run's topic after a statement went by gets it on a later round."""
        sent = 0
        for manifest in self.store.manifests():
            states = evaluations(manifest, self.store.evals(manifest.run_id), policy=self.policy(),
                                 min_keys=self.redundancy)
            if all(e.status.value != "unchecked" for e in states):
                continue
            for e in self.store.evals(manifest.run_id):
                await self.outbox.regossip(e)
                sent += 1
        return sent

    async def serve_evaluator(self, check: bool = True, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Every ``interval``: publish its own runs' results, check pending results (unless
        ``check`` is off, as on a node that audits nothing), then republish what is not settled."""
        task_status.started()
        while True:
            await self.publish_own_results()
            if check:
                await self.check_pending()
            await self.republish()
            await self.sleep(self.interval)

    def status(self, manifest: RunManifest) -> list[dict]:
        """The run's evaluations as coverage shows them (docs/protocol.md §8.5)."""
        return [{"state": e.state, "status": e.status.value, "loss_bits": e.loss, "checkers": list(e.checkers),
                 "dissenters": list(e.dissenters), "evidence": [d.hex() for d in e.evidence],
                 "devices": list(e.devices)}  # fmt: skip
                for e in evaluations(manifest, self.store.evals(manifest.run_id), policy=self.policy(),
                                     min_keys=self.redundancy)]

    async def submit(self, data: bytes) -> EvalStatement:
        """Store and gossip an ``eval`` signed elsewhere (a trainer's results, signed with the
        run's key): :class:`ApiError` 400 unless §7 accepts it."""
        verdict = self.validate(data)
        if not verdict.accepted:
            raise ApiError(400, f"not a valid eval: {verdict.reason}")
        await self.outbox.publish(verdict.message)
        return verdict.message

    def leaderboard_json(self) -> list[dict]:
        """The board this node's statements imply (docs/protocol.md §8.6), for ``/v1/leaderboard``."""
        return [r.to_json() for r in board(self.store, policy=self.policy(), redundancy=self.redundancy, now=self.now())]
