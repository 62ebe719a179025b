"""The outbox: the one way a node's own statements leave it — stored first, then gossiped.

Every producer hands its signed statement to :meth:`Outbox.publish`: the auditor's attestations,
the spot checker's spot checks, the replay proof's reveals, the evaluator's results and checks,
the dispute agent's fraud proofs (node/dispute_agent.py: the proof a dispute of this node's ended
in, judged by the referee in its bisection, then by the gossip rules as any proof is), and the API's reveals and submitted evaluations. A fraud
proof over the gossip bound is gossiped as its reference (node/fraud_proof_refs.py); one fetched
by reference is stored by the proof fetcher (node/fraud_proof_fetch.py), which announces it with
:meth:`Outbox.regossip`. The API takes no fraud proof: it lists and serves those the node holds.
A statement kind is publishable once :func:`~.topics.statement_topic` names its topic and
:meth:`~.statements.Statements.add_own` knows how the store keeps it (fraud proofs: one row per
conviction, node/store.py, node/fraud_proofs.py).

Stored first: the store is what sync serves, so a statement whose gossip fails still reaches
peers on their next sync round, and the node's own judgements (coverage, the planner, earned
trust) count it at once. A gossip that fails (no peer on the topic yet, a message the router
refuses) is tried again every :data:`RETRY_S`, up to :data:`TRIES` times in all, by
:meth:`Outbox.serve_outbox`; every outcome is counted in ``NodeStats.own_statements``
(``(kind, "gossiped" | "retried" | "failed")``).
"""

from __future__ import annotations

import logging
from typing import Protocol

import trio

from open1b.protocol import Attestation, EvalStatement, SpotCheck, WitnessReveal

from .clock import Clock
from .fraud_proof_refs import FraudProofRef, is_large
from .fraud_proofs import ProvenFraud
from .metrics import NodeStats
from .p2p import NetworkError
from .statements import Statements
from .topics import statement_topic

log = logging.getLogger("open1b.node.outbox")

OwnStatement = Attestation | WitnessReveal | SpotCheck | EvalStatement | ProvenFraud
RETRY_S = 5.0
TRIES = 4  # gossip attempts per statement, the first included; after them sync alone carries it
MAX_RETRYING = 1024  # statements waiting for a retry; beyond, the oldest is left to sync


class Publish(Protocol):
    """What the outbox needs of the network (:class:`~.p2p.P2P` in a daemon)."""

    async def publish(self, topic: str, data: bytes) -> None: ...


class StatementOutbox(Protocol):
    """What a producer needs of the outbox (:class:`Outbox`; a test may give its own)."""

    async def publish(self, statement: OwnStatement) -> bool: ...

    async def regossip(self, statement: OwnStatement) -> None: ...


class Outbox:
    def __init__(self, statements: Statements, gossip: Publish, *, clock: Clock, stats: NodeStats) -> None:
        self.statements, self.gossip, self.clock, self.stats = statements, gossip, clock, stats
        self._retrying: dict[bytes, tuple[OwnStatement, int]] = {}  # digest -> (statement, tries so far)

    async def publish(self, statement: OwnStatement) -> bool:
        """Store ``statement`` (signed here, or validated by the caller), then gossip it if it was
        new; True if it was. A failed gossip is retried later (:meth:`serve_outbox`), never raised:
        the statement is stored, and sync carries it."""
        if not self.statements.add_own(statement):
            return False
        await self._gossip(statement, 0)
        return True

    async def regossip(self, statement: OwnStatement) -> None:
        """Gossip a stored statement again (a topic's late joiners miss what went by before)."""
        await self._gossip(statement, 0)

    async def _gossip(self, statement: OwnStatement, tries: int) -> None:
        kind = statement.KIND
        message: OwnStatement | FraudProofRef = statement
        if isinstance(statement, ProvenFraud) and is_large(statement):
            message = FraudProofRef.of(statement)  # peers fetch the body by its digest (§18.7)
        try:
            await self.gossip.publish(statement_topic(message.KIND, statement.run), message.encoded)
        except NetworkError as exc:
            tries += 1
            if tries >= TRIES:
                self._count(kind, "failed")
                log.warning("gossip of our %s of run %s failed %d times, left to sync: %s", kind,
                            statement.run.hex()[:12], tries, exc)
                return
            if len(self._retrying) >= MAX_RETRYING:
                self._retrying.pop(next(iter(self._retrying)))
                self._count(kind, "failed")
            self._retrying[statement.digest] = (statement, tries)
            log.info("gossip of our %s of run %s failed, retrying in %.0f s: %s", kind, statement.run.hex()[:12],
                     RETRY_S, exc)
            return
        self._count(kind, "gossiped" if tries == 0 else "retried")

    def _count(self, kind: str, outcome: str) -> None:
        self.stats.own_statements[(kind, outcome)] += 1

    async def serve_outbox(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Every :data:`RETRY_S`, gossip again what failed."""
        task_status.started()
        while True:
            await self.clock.sleep(RETRY_S)
            await self.retry()

    async def retry(self) -> None:
        """One round of retries: each statement waiting is gossiped once more."""
        waiting, self._retrying = self._retrying, {}
        for statement, tries in waiting.values():
            await self._gossip(statement, tries)
