"""The referee off the event loop. Judging a fraud proof (:func:`.fraud_proofs.referee_fraud_proof`)
takes ~15 ms at 1 MiB and seconds at ``MAX_FRAUD_PROOF_SIZE`` (128 MiB); on trio's event loop
every peer's stream, the gossip and the DHT would stall meanwhile. :class:`RefereeWorker` runs it
in a worker thread, for proofs from gossip, sync and fetches by reference alike, with bounds:

- **Two at a time, node-wide**: one proof over the gossip bound (fetched by reference: up to
  seconds) and one within it (gossip, sync: milliseconds), each in arrival order, so a large
  proof never holds up the gossip validator past py-libp2p's validation timeout (5 s).
- **Per peer** (on gossip, where each message is validated in its own task): at most
  :data:`MAX_JUDGING_PER_PEER` proofs from one forwarding peer wait or run; beyond, a proof is
  ignored (``referee_busy``: not the sender's provable fault; sync brings it again). Sync and
  fetches judge one proof at a time each already.
- **The node's own proof** (:meth:`RefereeWorker.carry`): its bisection judged it when it built it
  (node/disputes.py, in a worker thread too): that verdict is carried, not the referee run again
  (seconds at `gpt-1b`'s proofs); the thread here decodes and hashes it, in its size's turn.
- **The stored proofs of another referee** (:meth:`RefereeWorker.judge_stored_again`, a daemon
  task): judged again one at a time, each in its size's turn, after the store opened
  (node/fraud_proof_store.py: pending meanwhile, not read out).
- **Once per bytes in flight**: gossipsub validates a message each time a mesh peer delivers it
  until one validation has ended, so identical bytes wait for the judgment under way.

The verdict is the referee's own: where it runs changes nothing of what it says.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from typing import Callable

import trio

from open1b.protocol import Outcome
from open1b.protocol.dispute import MAX_FRAUD_PROOF_SIZE, FraudVerdict
from open1b.protocol.validation import Verdict

from .fraud_proof_store import FraudProofs
from .fraud_proofs import (
    MAX_GOSSIP_FRAUD_PROOF,
    REFEREE,
    Bearing,
    ProvenFraud,
    proven_by,
    referee_fraud_proof,
    relevant_fraud,
)

log = logging.getLogger(__name__)

MAX_JUDGING_PER_PEER = 4


class _Judging:
    """One judgment under way: its verdict once the thread returned."""

    def __init__(self) -> None:
        self.done = trio.Event()
        self.verdict: Verdict[ProvenFraud] | None = None


class RefereeWorker:
    def __init__(self, bearing: Bearing) -> None:
        """``bearing``: what :func:`.fraud_proofs.relevant_fraud` reads of the node."""
        self.bearing = bearing
        self._large, self._small = trio.CapacityLimiter(1), trio.CapacityLimiter(1)
        self._judging: dict[bytes, _Judging] = {}
        self._per_peer: Counter[str] = Counter()

    async def judge(self, data: bytes, *, max_size: int = MAX_GOSSIP_FRAUD_PROOF,
                    peer: str | None = None) -> Verdict[ProvenFraud]:
        """:func:`.fraud_proofs.judge_fraud_proof` of ``data``: :meth:`referee` in a worker thread,
        then the node's rules (:func:`.fraud_proofs.relevant_fraud`) here, on the event loop, as
        they read the node's runs and store."""
        verdict = await self.referee(data, max_size=max_size, peer=peer)
        return relevant_fraud(verdict.message, self.bearing) if verdict.accepted else verdict

    async def carry(self, data: bytes, verdict: FraudVerdict) -> Verdict[ProvenFraud]:
        """:meth:`judge` of the proof ``data`` that this node built and judged in its own
        bisection (``verdict``, the referee's on exactly these bytes, node/disputes.py), without
        judging it again: its :class:`~.fraud_proofs.ProvenFraud` read in a worker thread
        (decoding and hashing up to ``MAX_FRAUD_PROOF_SIZE``), then the node's rules here."""
        if not verdict.accepted:
            return Verdict(verdict.outcome, verdict.reason, code=verdict.code)
        async with self._limiter(data):
            fraud = await trio.to_thread.run_sync(proven_by, data, verdict)
        return relevant_fraud(fraud, self.bearing)

    async def judge_stored_again(self, proofs: FraudProofs, kept: Callable[[ProvenFraud], None], *,
                                 task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Judge again, one at a time in the worker thread, the stored ``proofs`` judged by another
        referee (pending, not read out meanwhile: node/fraud_proof_store.py); each still kept goes
        to ``kept`` (the statements' listeners: coverage counts it from then on). Returns when
        none is left; the store opened without waiting for this."""
        task_status.started()
        judged = 0
        while (stale := proofs.next_stale()) is not None:
            verdict = await self.referee(stale.encoded, max_size=MAX_FRAUD_PROOF_SIZE)
            fraud = proofs.judged_again(stale, verdict.message if verdict.accepted else None)
            if fraud is not None:
                kept(fraud)
            judged += 1
        if judged:
            log.info("stored fraud proofs judged again by referee %s: %d", REFEREE, judged)

    def _limiter(self, data: bytes) -> trio.CapacityLimiter:
        return self._large if len(data) > MAX_GOSSIP_FRAUD_PROOF else self._small

    async def referee(self, data: bytes, *, max_size: int = MAX_GOSSIP_FRAUD_PROOF,
                      peer: str | None = None) -> Verdict[ProvenFraud]:
        """:func:`.fraud_proofs.referee_fraud_proof` of ``data``, in a worker thread (module doc).
        ``peer``: the gossip peer that delivered it, counted against its bound."""
        if len(data) > max_size:  # refused unread, as the referee's half would: no thread for it
            return referee_fraud_proof(data, max_size=max_size)
        if peer is not None and self._per_peer[peer] >= MAX_JUDGING_PER_PEER:
            return Verdict(Outcome.IGNORE, f"{MAX_JUDGING_PER_PEER} proofs from this peer are being judged",
                           code="referee_busy")
        if peer is not None:
            self._per_peer[peer] += 1
        try:
            return await self._referee(data)
        finally:
            if peer is not None:
                self._per_peer[peer] -= 1
                if not self._per_peer[peer]:
                    del self._per_peer[peer]

    async def _referee(self, data: bytes) -> Verdict[ProvenFraud]:
        while (other := self._judging.get(data)) is not None:
            await other.done.wait()
            if other.verdict is not None:
                return other.verdict
            # its caller was cancelled before the thread started: judged again here
        judging = self._judging[data] = _Judging()
        try:
            async with self._limiter(data):
                # A thread runs to its end whatever happens to its caller: its verdict is kept for
                # those that wait on the same bytes, and a cancellation lands right after.
                with trio.CancelScope(shield=True):
                    judging.verdict = await trio.to_thread.run_sync(
                        functools.partial(referee_fraud_proof, data, max_size=len(data)))  # bounded above
            return judging.verdict
        finally:
            del self._judging[data]
            judging.done.set()
