"""Prometheus metrics, off by default (``--metrics HOST:PORT``).

The daemon's :class:`NodeStats` is the single source of truth: the status API and this
exporter both read it, so the two can never disagree. :data:`METRIC_NAMES` is the golden list
(tests compare a live scrape against it; renaming a metric breaks dashboards and must be
deliberate).
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Callable, Iterable

from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import generate_latest

METRIC_NAMES = (
    "open1b_replays_total",
    "open1b_replay_failures_total",
    "open1b_replay_seconds",
    "open1b_claims_total",
    "open1b_gossip_messages_total",
    "open1b_attestations_received_total",
    "open1b_sync_statements_total",
    "open1b_attestations_stored",
    "open1b_peers_connected",
    "open1b_peers_banned",
    "open1b_runs_known",
    "open1b_blob_fetches_total",
    "open1b_blob_fetched_bytes_total",
    "open1b_blob_served_bytes_total",
    "open1b_blob_bad_providers_total",
    "open1b_blob_cache_bytes",
    "open1b_run_steps",
    "open1b_spot_checks_total",
    "open1b_spot_check_failures_total",
    "open1b_challenges_answered_total",
    "open1b_trusted_keys",
    "open1b_own_statements_total",
    "open1b_reachability",
    "open1b_relay_reservations",
    "open1b_relay_requests_refused_total",
    "open1b_hole_punches_total",
    "open1b_bulk_dialbacks_total",
)
RUN_STEP_STATUSES = ("verified", "disputed", "refuted")  # the per-run gauge's statuses
REACHABILITY_STATES = ("public", "private", "unknown")

REPLAY_SECONDS_BUCKETS = (0.01, 0.1, 1.0, 10.0, 60.0, 600.0, 3600.0, 4 * 3600.0, 24 * 3600.0)


@dataclass
class NodeStats:
    replays: int = 0
    replay_failures: int = 0
    replay_seconds_sum: float = 0.0
    replay_seconds_buckets: list[int] = field(default_factory=lambda: [0] * len(REPLAY_SECONDS_BUCKETS))
    claims_won: int = 0
    claims_lost: int = 0
    gossip: dict[tuple[str, str], int] = field(default_factory=dict)  # (kind, outcome) -> count
    attestations_received: int = 0
    synced: int = 0
    busy_step: int | None = None
    replay_device: str | None = None  # the class of the device the last replay ran on
    # run hex -> status -> steps, as this node's coverage last judged the run (judge.refresh)
    run_steps: dict[str, dict[str, int]] = field(default_factory=dict)
    replayed: list[tuple[str, int]] = field(default_factory=list)
    spot_checks: Counter[tuple[str, str]] = field(default_factory=Counter)  # (verdict, caught) -> signed
    spot_failures: int = 0  # spot checks the worker could not run (no verdict signed)
    challenges_answered: int = 0  # answers this node gave to others' challenges (node/spot_answers.py)
    disputes: Counter[tuple[str, str]] = field(default_factory=Counter)  # ("opened" | "answered", outcome) -> count
    recent_disputes: deque[dict] = field(default_factory=lambda: deque(maxlen=16))  # node/dispute_agent.py
    # outcome -> fetches of fraud proofs' bodies by reference (node/fraud_proof_fetch.py)
    proof_fetches: Counter[str] = field(default_factory=Counter)
    # (kind, "gossiped" | "retried" | "failed") -> own statements (node/outbox.py)
    own_statements: Counter[tuple[str, str]] = field(default_factory=Counter)

    def record_replay(self, seconds: float) -> None:
        self.replays += 1
        self.replay_seconds_sum += seconds
        for i, bound in enumerate(REPLAY_SECONDS_BUCKETS):
            if seconds <= bound:
                self.replay_seconds_buckets[i] += 1

    def record_gossip(self, kind: str, outcome: str) -> None:
        self.gossip[(kind, outcome)] = self.gossip.get((kind, outcome), 0) + 1

    def gossip_count(self, outcome: str) -> int:
        return sum(n for (_, o), n in self.gossip.items() if o == outcome)


@dataclass(frozen=True)
class Gauges:
    attestations_stored: int
    peers_connected: int
    peers_banned: int
    runs_known: int
    # blob layer (node/runs.py, node/blobs.py): counters read at scrape time
    blobs_fetched: int = 0
    blob_fetch_failures: int = 0
    blob_fetched_bytes: int = 0
    blob_served_bytes: int = 0
    blob_bad_providers: int = 0
    blob_cache_bytes: int = 0
    # keys whose attestations coverage counts: the operator's list, and those that earned trust
    trusted_listed: int = 0
    trusted_earned: int = 0
    # whether peers can dial this node (node/reachability.py): public, private or unknown
    reachability: str = "unknown"
    # circuit relay v2 and hole punching (node/relays.py): reservations this node holds on relays and
    # serves as one; hop requests it refused (while not public) and reservations (all slots taken)
    relay_reservations_held: int = 0
    relay_reservations_served: int = 0
    relay_refused_not_public: int = 0
    relay_refused_full: int = 0
    hole_punches_attempted: int = 0  # punches this node started
    hole_punches_succeeded: int = 0
    hole_punches_answered: int = 0  # punches it joined
    # bulk sessions this node opened to a fetcher that asked (node/bulk.py: behind NAT), and requests refused
    bulk_dialbacks_served: int = 0
    bulk_dialbacks_refused: int = 0


class _Collector:
    def __init__(self, stats: NodeStats, gauges: Callable[[], Gauges]) -> None:
        self._stats, self._gauges = stats, gauges

    def collect(self) -> Iterable:
        s, g = self._stats, self._gauges()
        yield CounterMetricFamily("open1b_replays", "Steps replayed to completion", value=s.replays)
        spots = CounterMetricFamily("open1b_spot_checks", "Spot checks signed, by verdict and the link caught",
                                    labels=["verdict", "caught"])
        for (verdict, caught), n in sorted(s.spot_checks.items()):
            spots.add_metric([verdict, caught], n)
        yield spots
        yield CounterMetricFamily("open1b_spot_check_failures", "Spot checks that could not run (no verdict signed)",
                                  value=s.spot_failures)
        yield CounterMetricFamily("open1b_challenges_answered", "Spot-check challenges of our runs answered",
                                  value=s.challenges_answered)
        yield CounterMetricFamily("open1b_replay_failures", "Replays that failed (bad input, crash, timeout)",
                                  value=s.replay_failures)
        buckets = [(repr(b), n) for b, n in zip(REPLAY_SECONDS_BUCKETS, s.replay_seconds_buckets)]
        yield HistogramMetricFamily("open1b_replay_seconds", "Wall time of one replay",
                                    buckets=buckets + [("+Inf", s.replays)], sum_value=s.replay_seconds_sum)
        claims = CounterMetricFamily("open1b_claims", "Claims attempted, by result", labels=["result"])
        claims.add_metric(["won"], s.claims_won)
        claims.add_metric(["lost"], s.claims_lost)
        yield claims
        gossip = CounterMetricFamily("open1b_gossip_messages", "Gossip messages validated", labels=["kind", "outcome"])
        for (kind, outcome), n in sorted(s.gossip.items()):
            gossip.add_metric([kind, outcome], n)
        yield gossip
        own = CounterMetricFamily("open1b_own_statements", "Own statements stored then gossiped, by kind and "
                                  "gossip outcome (gossiped, retried: on a later try, failed: left to sync)",
                                  labels=["kind", "outcome"])
        for (kind, outcome), n in sorted(s.own_statements.items()):
            own.add_metric([kind, outcome], n)
        yield own
        yield CounterMetricFamily("open1b_attestations_received", "New attestations stored from peers",
                                  value=s.attestations_received)
        yield CounterMetricFamily("open1b_sync_statements", "New statements pulled by the sync protocol",
                                  value=s.synced)
        yield GaugeMetricFamily("open1b_attestations_stored", "Attestations in the store", value=g.attestations_stored)
        yield GaugeMetricFamily("open1b_peers_connected", "Connected libp2p peers", value=g.peers_connected)
        yield GaugeMetricFamily("open1b_peers_banned", "Peers disconnected for invalid messages", value=g.peers_banned)
        yield GaugeMetricFamily("open1b_runs_known", "Runs this node knows", value=g.runs_known)
        reach = GaugeMetricFamily("open1b_reachability", "1 for whether peers can dial this node (dial-back test)",
                                  labels=["state"])
        for state in REACHABILITY_STATES:
            reach.add_metric([state], 1 if g.reachability == state else 0)
        yield reach
        relay = GaugeMetricFamily("open1b_relay_reservations", "Circuit relay v2 reservations: held by this node on "
                                  "relays (behind NAT), served by it as a relay", labels=["role"])
        relay.add_metric(["held"], g.relay_reservations_held)
        relay.add_metric(["served"], g.relay_reservations_served)
        yield relay
        refused = CounterMetricFamily("open1b_relay_requests_refused", "Relay requests refused, by reason (not_public: "
                                      "this node is not public; full: every reservation slot taken)", labels=["reason"])
        refused.add_metric(["not_public"], g.relay_refused_not_public)
        refused.add_metric(["full"], g.relay_refused_full)
        yield refused
        punches = CounterMetricFamily("open1b_hole_punches", "DCUtR hole punches: attempted and succeeded (started by "
                                      "this node), answered (started by the peer)", labels=["event"])
        punches.add_metric(["attempted"], g.hole_punches_attempted)
        punches.add_metric(["succeeded"], g.hole_punches_succeeded)
        punches.add_metric(["answered"], g.hole_punches_answered)
        yield punches
        dialbacks = CounterMetricFamily("open1b_bulk_dialbacks", "Bulk sessions asked of this node by dial-back "
                                        "(behind NAT), by result", labels=["result"])
        dialbacks.add_metric(["served"], g.bulk_dialbacks_served)
        dialbacks.add_metric(["refused"], g.bulk_dialbacks_refused)
        yield dialbacks
        fetches = CounterMetricFamily("open1b_blob_fetches", "Blobs fetched from peers, by result", labels=["result"])
        fetches.add_metric(["ok"], g.blobs_fetched)
        fetches.add_metric(["failed"], g.blob_fetch_failures)
        yield fetches
        yield CounterMetricFamily("open1b_blob_fetched_bytes", "Verified blob bytes fetched from peers",
                                  value=g.blob_fetched_bytes)
        yield CounterMetricFamily("open1b_blob_served_bytes", "Blob bytes served to peers", value=g.blob_served_bytes)
        yield CounterMetricFamily("open1b_blob_bad_providers", "Providers caught serving bytes that are not the blob",
                                  value=g.blob_bad_providers)
        yield GaugeMetricFamily("open1b_blob_cache_bytes", "Bytes in the blob cache", value=g.blob_cache_bytes)
        trusted = GaugeMetricFamily("open1b_trusted_keys", "Keys this node's trust policy counts, by source "
                                    "(listed by the operator, or earned: docs/protocol.md §8.1.1)", labels=["source"])
        trusted.add_metric(["listed"], g.trusted_listed)
        trusted.add_metric(["earned"], g.trusted_earned)
        yield trusted
        runs = GaugeMetricFamily("open1b_run_steps", "Steps of a run by coverage status (this node's trust policy)",
                                 labels=["run", "status"])
        for run, counts in sorted(s.run_steps.items()):
            for status in RUN_STEP_STATUSES:
                runs.add_metric([run, status], counts.get(status, 0))
        yield runs


def metrics_registry(stats: NodeStats, gauges: Callable[[], Gauges]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(stats, gauges))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
