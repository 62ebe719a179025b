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
from typing import Callable

from open1b.protocol import MATCH, Attestation, Identity, RunManifest, WitnessReveal
from open1b.protocol.witness import witness_binding, witness_commitment

from .store import Store

log = logging.getLogger("open1b.node.replay_proof")


class ReplayProof:
    def __init__(self, identity: Identity, store: Store, counts: Callable[[bytes, bytes], bool]) -> None:
        """``counts(run, key)``: whether this node's trust policy counts ``key`` in ``run`` (only
        their copies are worth revealing a witness for)."""
        self.identity, self.store, self.counts = identity, store, counts
        self._known: dict[bytes, dict[int, bytes]] = {}  # run -> step -> W_step from our own replays
        self._public: dict[bytes, dict[int, bytes]] = {}  # run -> step -> W_step of a held, valid reveal
        self._pending: set[tuple[bytes, int]] = set()
        self.revealed = 0  # reveals this node has made since it started
        self.commitment_mismatches = 0  # replays that reproduced h_{k+1} but not C_k

    def known(self, run: bytes) -> dict[int, bytes]:
        if run not in self._known:
            self._known[run] = self.store.replay_witnesses(run)
        return self._known[run]

    def public(self, run: bytes) -> dict[int, bytes]:
        if run not in self._public:
            self._public[run] = {r.step: r.witness for r in self.store.reveals(run)}
        return self._public[run]

    def stored_reveal(self, reveal: WitnessReveal) -> None:
        """A valid reveal was stored (ours or a peer's)."""
        self.public(reveal.run)[reveal.step] = reveal.witness

    def disproves(self, att: Attestation) -> bool:
        """Whether a held reveal proves ``att`` a match signed without knowing its step's witness
        (coverage does not count it: docs/protocol.md §8.2)."""
        witness = self.public(att.run).get(att.step)
        return (witness is not None and att.verdict == MATCH
                and att.witness != witness_binding(att.run, att.step, att.signer, witness))

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
        if not self.counts(att.run, att.signer):
            return
        if att.witness != witness_binding(att.run, att.step, att.signer, witness):
            self._pending.add((att.run, att.step))

    def due(self, now: int) -> list[WitnessReveal]:
        """The reveals to publish now (already stored): one per pending step not revealed yet."""
        out = []
        for run, step in sorted(self._pending):
            if self.store.reveals(run, step):
                continue  # someone revealed it already: everyone can check the copy
            reveal = WitnessReveal.create(self.identity, run=run, step=step, witness=self.known(run)[step],
                                          issued_at=now)
            self.store.add_reveal(reveal)
            self.stored_reveal(reveal)
            self.revealed += 1
            log.warning("step %d of run %s: a match binds another witness than our replay's; revealing W_%d",
                        step, run.hex()[:12], step)
            out.append(reveal)
        self._pending.clear()
        return out
