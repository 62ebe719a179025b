"""Proof of replay on the node: keep the witnesses of our own replays, and reveal one when a
counted key's ``match`` binds another witness (docs/run-format.md §5).

A replay of step k that reproduces h_{k+1} and whose witness W_k opens the manifest's C_k tells
this node W_k. It keeps it (in the store, so a restart does not forget it) and checks every
``match`` of step k it holds or receives against it. A binding that is wrong for its signer
proves the signer never computed W_k; one :class:`WitnessReveal` per step then lets every node
check that signer without replaying (coverage flags it a ``copier``). A step is revealed at most
once by this node, and not at all while a valid reveal of it is already held: once W_k is
public, a later copier of step k could bind it, so it is published only when someone must be
caught with it.
"""

from __future__ import annotations

import logging
from typing import Awaitable, Callable

import trio

from open1b.protocol import MATCH, Attestation, Identity, RunManifest, WitnessReveal
from open1b.protocol.witness import witness_binding, witness_commitment

from .clock import Clock
from .counting import Counting
from .store import Store

log = logging.getLogger("open1b.node.replay_proof")

REVEAL_EVERY_S = 1.0


class ReplayProof:
    def __init__(self, identity: Identity, store: Store, counting: Counting) -> None:
        """``counting``: whose keys count (only their copies are worth revealing a witness for)."""
        self.identity, self.store, self.counting = identity, store, counting
        self._known: dict[bytes, dict[int, bytes]] = {}  # run -> step -> W_step from our own replays
        self._pending: set[tuple[bytes, int]] = set()
        self.revealed = 0  # reveals this node has made since it started
        self.commitment_mismatches = 0  # replays that reproduced h_{k+1} but not C_k

    def known(self, run: bytes) -> dict[int, bytes]:
        if run not in self._known:
            self._known[run] = self.store.replay_witnesses(run)
        return self._known[run]

    def stored(self, statement: object) -> None:
        """A statement was stored (:mod:`.statements` tells every one): an attestation is checked."""
        if isinstance(statement, Attestation):
            self.check(statement)

    def replayed(self, manifest: RunManifest, step: int, post_state: bytes, witness: bytes) -> None:
        """Our replay of ``step`` produced ``post_state`` and ``witness``: keep W_step if it is the
        run's, and check the matches of that step we already hold."""
        if post_state != manifest.state_hashes[step + 1]:
            return  # a mismatch: our witness is of another computation than the trainer's
        if witness_commitment(witness) != manifest.witnesses[step]:
            # The states agree but the trainer's commitment does not: it committed to something no
            # replay yields. We cannot prove it; we only never reveal (nor judge) with it.
            self.commitment_mismatches += 1
            log.warning("step %d of run %s: replay reproduces h_%d but not the witness commitment C_%d",
                        step, manifest.run_id.hex()[:12], step + 1, step)
            return
        self.store.add_replay_witness(manifest.run_id, step, witness)
        self.known(manifest.run_id)[step] = witness
        for att in self.store.attestations(manifest.run_id, step):
            self.check(att)

    def check(self, att: Attestation) -> None:
        """Note ``att``'s step for a reveal if it is a counted key's match whose binding is wrong."""
        witness = self.known(att.run).get(att.step)
        if witness is None or att.verdict != MATCH or att.signer == self.identity.public_key:
            return
        if not self.counting.counts(att.run, att.signer):
            return
        if att.witness != witness_binding(att.run, att.step, att.signer, witness):
            self._pending.add((att.run, att.step))

    def due(self, now: int) -> list[WitnessReveal]:
        """The reveals to publish now, signed: one per pending step not revealed yet."""
        out = []
        for run, step in sorted(self._pending):
            if self.store.reveals(run, step):
                continue  # someone revealed it already: everyone can check the copy
            reveal = WitnessReveal.create(self.identity, run=run, step=step, witness=self.known(run)[step],
                                          issued_at=now)
            self.revealed += 1
            log.warning("step %d of run %s: a match binds another witness than our replay's; revealing W_%d",
                        step, run.hex()[:12], step)
            out.append(reveal)
        self._pending.clear()
        return out

    async def serve_reveals(self, publish: Callable[[WitnessReveal], Awaitable[object]], *,
                            clock: Clock, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Every second, ``publish`` (the outbox: stored, then gossiped) the reveals our replays call for."""
        task_status.started()
        while True:
            await clock.sleep(REVEAL_EVERY_S)
            for reveal in self.due(clock.wall()):
                await publish(reveal)
