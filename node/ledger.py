"""A node's statements and its judgements of them, wired so that data flows one way:

    gossip, sync, the claim agent ──▶ statements ──stored──▶ judge ──sets──▶ counting
    the node's producers ──▶ outbox ─┘ (then gossip)  │        └──recount──▶ planner view
                                                      ├──stored──▶ replay proof
                                                      └──stored──▶ planner view

The planner view and the replay proof read the counting; the judge alone writes it. Each
"stored" and "recount" arrow is a listener given here, at wiring time, and no listener calls
back into what told it.
:func:`build_ledger` builds the whole (the daemon, and tests that need a node's bookkeeping
without its network); :class:`Ledger` only holds the parts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from open1b.protocol import Identity, RunManifest

from .clock import Clock
from .config import NodeConfig
from .counting import Counting
from .earned_trust import EarnRule
from .judge import Judge
from .metrics import NodeStats
from .outbox import Outbox, Publish
from .planner_view import PlannerView
from .replay_proof import ReplayProof
from .statements import Gossip, Listener, Statements
from .store import Store


@dataclass(frozen=True)
class Ledger:
    identity: Identity
    config: NodeConfig
    manifests: dict[bytes, RunManifest]  # the runs this node knows (statements adds to it)
    store: Store
    statements: Statements
    counting: Counting
    judge: Judge
    planner: PlannerView
    proof: ReplayProof
    outbox: Outbox


class LedgerGossip(Gossip, Publish, Protocol):
    """The network the ledger needs: validators, subscriptions, penalties and publishing."""


def build_ledger(identity: Identity, config: NodeConfig, store: Store, gossip: LedgerGossip, *, clock: Clock,
                stats: NodeStats, listeners: tuple[Listener, ...] = ()) -> Ledger:
    """The ledger over ``store`` (the runs it holds are known from the start); ``listeners``: told
    each stored statement after the ledger's own (the dispute inbox, node/dispute_agent.py)."""
    me = identity.public_key  # derived from the seed on every read: once here
    manifests = {m.run_id: m for m in store.manifests()}
    counting = Counting(me, config.trust(me), store, plan_with_untrusted=config.plan_with_untrusted)
    planner = PlannerView(me, config.redundancy, manifests, store, counting, clock=clock.wall)
    earn = EarnRule(config.earn_trust_matches, config.earn_trust_publishers) if config.earn_trust else None
    judge = Judge(manifests, store, counting, redundancy=config.redundancy, earn=earn, clock=clock, stats=stats,
                  listeners=(planner.recount,))
    proof = ReplayProof(identity, store, counting)
    # the judge first: a reveal changes what counts before the others look at it
    statements = Statements(manifests, store, gossip, publishers=config.publishers,
                            trusts=lambda key: counting.trust.trusts(key), clock=clock, stats=stats,
                            listeners=(judge.stored, proof.stored, planner.stored, *listeners))
    outbox = Outbox(statements, gossip, clock=clock, stats=stats)
    return Ledger(identity, config, manifests, store, statements, counting, judge, planner, proof, outbox)
