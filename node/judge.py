"""The judge: what this node concludes from the statements it holds.

* coverage of each run (:func:`open1b.protocol.coverage`) under the trust policy now, and the keys
  it flags (docs/protocol.md §8.1), set in :class:`~.counting.Counting`;
* earned trust (:mod:`.earned_trust`), recomputed from the store when statements arrive and set
  in the counting too; each change of what counts (and each reveal held) is told, as a
  :class:`~.counting.Recount`, to the listeners given at wiring time (the planner's view);
* spot coverage (docs/protocol.md §8.7) and the steps a counted spot check failed.

It is told what was stored (:meth:`Judge.stored`), notes which runs have news, and judges them
again once a second (:meth:`Judge.serve_judge`): flags are re-judged per batch of statements,
not per statement.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Callable, Iterable, Mapping

import trio

from open1b.protocol import (
    Attestation,
    Coverage,
    RunManifest,
    SpotCheck,
    SpotCoverage,
    TrustPolicy,
    coverage,
    peer_id_from_public_key,
    public_key_from_peer_id,
    spot_coverage,
)
from open1b.protocol.coverage import ALLOWLIST
from open1b.protocol.spotcheck import FAIL
from open1b.protocol.witness import WitnessReveal

from .clock import Clock
from .counting import Counting, Recount
from .earned_trust import EarnedTrust, EarnRule
from .fraud_proofs import ProvenFraud
from .metrics import NodeStats
from .store import Store

log = logging.getLogger("open1b.node.judge")

JUDGE_EVERY_S = 1.0


class Judge:
    def __init__(self, manifests: Mapping[bytes, RunManifest], store: Store, counting: Counting, *,
                 redundancy: int, earn: EarnRule | None, clock: Clock, stats: NodeStats,
                 listeners: Iterable[Callable[[Recount], None]] = ()) -> None:
        """``earn``: the rule keys earn trust by, or None when this node does not let them;
        ``listeners``: told every change of what counts."""
        self.manifests, self.store, self.counting, self.redundancy = manifests, store, counting, redundancy
        self.clock, self.stats, self.listeners = clock, stats, list(listeners)
        listed = counting.listed
        self._earn = (EarnedTrust(store, listed.roots, listed.quorum, earn)
                      if earn is not None and listed.name == ALLOWLIST else None)
        self._stale: set[bytes] = set(manifests)  # runs with statements not judged yet: all at start
        self._spotchecks: dict[bytes, list[SpotCheck]] = {}  # per run, as stored (see _run_spotchecks)
        self._spot_coverage: dict[bytes, tuple[tuple, SpotCoverage]] = {}  # per run: (inputs, result)

    @property
    def trust(self) -> TrustPolicy:
        return self.counting.trust

    def stored(self, statement: object) -> None:
        """A statement was stored (:mod:`.statements` tells every one)."""
        if isinstance(statement, (Attestation, RunManifest, ProvenFraud)):
            self._stale.add(statement.run_id if isinstance(statement, RunManifest) else statement.run)
        elif isinstance(statement, WitnessReveal):
            # coverage may flag a copier now, and the planner stops counting the matches it disproves
            self._tell(self.counting.held_reveal(statement))
            self._stale.add(statement.run)
        elif isinstance(statement, SpotCheck) and statement.run in self._spotchecks:
            self._spotchecks[statement.run].append(statement)

    # -- replay coverage -----------------------------------------------------------------------
    def coverage(self, run: bytes, redundancy: int | None = None) -> Coverage:
        now = self.clock.wall()
        return coverage(
            self.manifests[run], self.store.attestations(run), self.store.claims(run, live_at=now),
            reveals=self.store.reveals(run),
            convictions=self.store.fraud.convictions(run),
            now=now, redundancy=redundancy or self.redundancy, policy=self.counting.trust,
        )

    def refresh(self) -> bool:
        """Judge earned trust and flags again for the runs with news; True if either changed
        (the counting tells its listeners what)."""
        changed = bool(self._stale) and self._refresh_earned()
        for run in list(self._stale):
            self._stale.discard(run)
            cov = self.coverage(run)
            self.stats.run_steps[run.hex()] = dict(Counter(s.status for s in cov.steps))
            flagged = frozenset(public_key_from_peer_id(f.signer) for f in cov.flagged)
            if self._tell(self.counting.set_flagged(run, flagged)):
                log.warning("run %s: flagged keys now %s", run.hex()[:12],
                            sorted(peer_id_from_public_key(k) for k in flagged) or "none")
                changed = True
        return changed

    def _refresh_earned(self) -> bool:
        """Recompute the earned keys from the store; True if the set changed (then every run is
        judged again under the new policy)."""
        if self._earn is None:
            return False
        earned = self._earn(self.manifests.values(), self._stale)
        changed = self._tell(self.counting.set_earned(earned))
        if changed:
            log.info("earned trust: %s", sorted(peer_id_from_public_key(k) for k in earned) or "none")
            self._stale.update(self.manifests)
        return changed

    def _tell(self, recount: Recount | None) -> bool:
        """Tell the listeners what ``recount`` touches; whether there was anything."""
        if recount is None:
            return False
        for listener in self.listeners:
            listener(recount)
        return True

    async def serve_judge(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Every second: judge again the runs with news."""
        task_status.started()
        while True:
            await self.clock.sleep(JUDGE_EVERY_S)
            self.refresh()

    # -- spot checks -----------------------------------------------------------------------------
    def _run_spotchecks(self, run: bytes) -> list[SpotCheck]:
        """The run's stored spot checks, read from the store once and then kept up to date: the
        spot checker's lanes and the replay planner ask on every pass, and reading and decoding
        them all each time (0.26 s for 679 of them) starved a daemon's event loop."""
        if run not in self._spotchecks:
            self._spotchecks[run] = list(self.store.spotchecks(run))
        return self._spotchecks[run]

    def spot_failed(self, run: bytes) -> list[int]:
        """Steps a counted spot check failed (the replay planner takes them first). Stored spot checks
        passed §7's rules on the way in, so only the trust policy is applied here."""
        trust = self.counting.trust
        return sorted({s.step for s in self._run_spotchecks(run) if s.verdict == FAIL and trust.trusts(s.signer)})

    def spot_coverage(self, run: bytes, replay: Coverage) -> SpotCoverage:
        """Spot-check status and escape probabilities (docs/protocol.md §8.7); the steps ``replay``
        decided (verified or refuted) count as caught. Computed again only when the run's spot
        checks, its decided steps or the trust policy changed (each pass re-checks every
        statement's challenge signatures: 0.23 s for 679)."""
        decided = frozenset(replay.replayed_steps)
        statements = self._run_spotchecks(run)
        trust = self.counting.trust
        key = (len(statements), decided, trust)
        cached = self._spot_coverage.get(run)
        if cached is None or cached[0] != key:
            cached = key, spot_coverage(self.manifests[run], statements, policy=trust, replayed=decided)
            self._spot_coverage[run] = cached
        return cached[1]
