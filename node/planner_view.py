"""The planner's view: per run, a :class:`~.deficits.DeficitIndex` of the statements that count
for planning and the run's :class:`~.planner.StepOrder`.

A run's index is built from the store on first use; from then on it follows, one statement at a
time, what it is told:

* :meth:`PlannerView.stored` — a statement was stored (:mod:`.statements` tells every one): an
  attestation is counted if :meth:`~.counting.Counting.plans_with` says so, a live claim makes
  its step busy;
* :meth:`PlannerView.recount` — what counts changed (:class:`~.counting.Recount`: keys flagged or
  cleared, trust earned or lost, a reveal held): only the attestations it names are judged again,
  and added to or removed from the index.

So the index always equals one built afresh from the store under the current
:class:`~.counting.Counting` (tests/node/test_planner_view.py checks this on random histories),
without a rebuild on every reveal or flag change. It reads the store and the counting, and calls
nothing back.
"""

from __future__ import annotations

from typing import Callable, Mapping

from open1b.protocol import MATCH, Attestation, Claim, RunManifest

from .counting import Counting, Recount
from .deficits import DeficitIndex
from .fraud_proofs import ProvenFraud
from .planner import StepOrder
from .store import Store


class PlannerView:
    def __init__(self, me: bytes, redundancy: int, manifests: Mapping[bytes, RunManifest], store: Store,
                 counting: Counting, *, clock: Callable[[], int]) -> None:
        """``manifests``: the runs this node knows (read, never written); ``clock``: wall seconds."""
        self.me, self.redundancy, self.manifests, self.store = me, redundancy, manifests, store
        self.counting, self.clock = counting, clock
        self._indexes: dict[bytes, DeficitIndex] = {}
        self._orders: dict[bytes, StepOrder] = {}
        self._counted: dict[bytes, set[bytes]] = {}  # run -> digests of the attestations its index counts

    def index(self, run: bytes) -> DeficitIndex:
        """The run's index, advanced to now."""
        now = self.clock()
        index = self._indexes.get(run)
        if index is None:
            index = self._build(run, now)
        index.advance(now)
        return index

    def order(self, run: bytes) -> StepOrder:
        self.index(run)
        return self._orders[run]

    def _build(self, run: bytes, now: int) -> DeficitIndex:
        manifest = self.manifests[run]
        steps = manifest.steps
        index = self._indexes[run] = DeficitIndex(
            steps, self.redundancy, me=self.me, now=now, quorum=self.counting.trust.quorum,
            published=manifest.state_hashes[1:],
            refuted={f.step for f in self.store.fraud.of_run(run) if self._refutes(f)})
        self._orders[run] = StepOrder(run, self.me, steps)
        self._counted[run] = set()
        for att in self.store.attestations(run):
            self._judge(att)
        for claim in self.store.claims(run, live_at=now):
            index.add_claim(claim.step, claim.claimant, claim.issued_at, claim.lease_expiry, claim.expected_done,
                            claim.device)
        return index

    # -- told -------------------------------------------------------------------------------------
    def stored(self, statement: object) -> None:
        """A statement was stored. A run whose index is not built yet is left to the build (the
        store has the statement)."""
        if isinstance(statement, Attestation) and statement.run in self._indexes:
            self._judge(statement)
        elif isinstance(statement, Claim) and statement.run in self._indexes:
            self._indexes[statement.run].add_claim(statement.step, statement.claimant, statement.issued_at,
                                                   statement.lease_expiry, statement.expected_done, statement.device)
        elif isinstance(statement, ProvenFraud) and statement.run in self._indexes and self._refutes(statement):
            # a step refuted by a proof: rare (one per forged step), so the index is built again,
            # from the store, on its next read
            del self._indexes[statement.run]

    def _refutes(self, fraud: ProvenFraud) -> bool:
        """Whether ``fraud`` refutes its step: it convicts the publisher of the published h_{k+1}
        (docs/protocol.md §8.3)."""
        manifest = self.manifests[fraud.run]
        return any(c.guilty == manifest.publisher and c.post_state == manifest.state_hashes[fraud.step + 1]
                   for c in fraud.convictions())

    def recount(self, change: Recount) -> None:
        """What counts changed: judge again the attestations it touches, in the runs built so far."""
        for run in [change.run] if change.run is not None else list(self._indexes):
            if run not in self._indexes:
                continue
            if change.step is not None:
                touched = self.store.attestations(run, change.step)
            else:
                touched = [a for a in self.store.attestations(run) if a.signer in change.keys]
            for att in touched:
                self._judge(att)

    def _judge(self, att: Attestation) -> None:
        """Count ``att`` in its run's index if the planner counts it now, and only then."""
        counted, index = self._counted[att.run], self._indexes[att.run]
        wanted = self.counting.plans_with(att)
        if not wanted:  # its signer is finished with the step all the same
            index.add_uncounted(att.step, att.signer)
        if wanted and att.digest not in counted:
            counted.add(att.digest)
            index.advance(self.clock())  # the pace counts it when it arrives
            index.add_attestation(att.step, att.signer, att.verdict == MATCH, att.device, att.elapsed_ms / 1000,
                                  at=att.issued_at, post_state=att.post_state)
        elif not wanted and att.digest in counted:
            counted.discard(att.digest)
            index.remove_attestation(att.step, att.signer, att.verdict == MATCH, att.device, post_state=att.post_state)
