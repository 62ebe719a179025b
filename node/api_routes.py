"""The local API's routes (served by :mod:`.api`): status, peers, runs, coverage, statements,
evaluations and the leaderboard (:mod:`.evaluator`'s routes) and
claims to read; publish, fetch, reveal and shutdown to act. Each handler reads the components it
was given and renders with :mod:`.views`; bad requests raise :class:`~.api.ApiError`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import trio

from open1b.protocol import Identity, WitnessReveal
from open1b.protocol.validation import validate_reveal

from . import views
from .api import ApiError, RawResponse, Route
from .auditor import Auditor
from .config import NodeConfig
from .evaluator import Evaluator
from .ingest import Gossip, Ingest
from .metrics import Gauges, NodeStats, metrics_registry, render
from .p2p import P2P
from .publisher import Publisher
from .runs import RunFiles, RunFilesError, why_not_auditable
from .topics import reveals_topic
from .worker import ReplayWorker


@dataclass(frozen=True)
class Components:
    """What the routes read: the daemon's components."""

    identity: Identity
    config: NodeConfig
    p2p: P2P
    ingest: Ingest
    publisher: Publisher
    auditor: Auditor
    runfiles: RunFiles
    stats: NodeStats
    worker: ReplayWorker
    shutdown: trio.Event
    evaluator: Evaluator

    def gauges(self) -> Gauges:
        f, cache = self.runfiles.stats, self.runfiles.cache
        return Gauges(self.ingest.store.attestation_count(), len(self.p2p.connected_peers()), len(self.p2p.banned),
                      len(self.ingest.manifests), blobs_fetched=f.fetched, blob_fetch_failures=f.failed,
                      blob_fetched_bytes=f.fetched_bytes, blob_served_bytes=cache.served_bytes,
                      blob_bad_providers=f.bad_providers, blob_cache_bytes=cache.used_bytes())

    def status(self) -> dict:
        s, g, ingest, p2p = self.stats, self.gauges(), self.ingest, self.p2p
        return {
            "peer_id": p2p.peer_id, "addrs": p2p.addrs, "peers": p2p.connected_peers(),
            "runs": [r.hex() for r in ingest.manifests], "audit": self.config.audit,
            "redundancy": self.config.redundancy, "attestations_stored": g.attestations_stored,
            "replays": s.replays, "replay_failures": s.replay_failures, "claims_won": s.claims_won,
            "device": {"requested": self.worker.device_spec, "class": self.worker.device,
                       "reason": self.worker.device_reason},
            "claims_lost": s.claims_lost, "gossip_rejected": s.gossip_count("reject"),
            "gossip_ignored": s.gossip_count("ignore"), "synced": s.synced, "peers_banned": g.peers_banned,
            "replaying_step": s.busy_step, "replayed": s.replayed,
            "trust_policy": ingest.trust.name, "validation": dict(sorted(ingest.validation.items())),
            "banned": sorted(p2p.banned), "penalties": dict(sorted(p2p.rejected.items())),
            "behaviour": self.config.behaviour or None,
            "reveals_made": ingest.proof.revealed, "witness_commitment_mismatches": ingest.proof.commitment_mismatches,
            "runs_synced": ingest.runs_synced, "blobs": self.blob_status(),
        }

    def blob_status(self) -> dict:
        f, cache = self.runfiles.stats, self.runfiles.cache
        return {"fetched": f.fetched, "bulk_fetched": f.bulk_fetched, "fetched_bytes": f.fetched_bytes,
                "fetch_failures": f.failed,
                "bad_providers": f.bad_providers, "served_bytes": cache.served_bytes,
                "cache_bytes": cache.used_bytes(), "cache_limit": cache.max_bytes, "pinned": len(cache.pinned),
                "fetching": {name: {"done": d, "total": t} for name, (d, t) in f.in_flight.items()}}


def run_arg(ingest: Ingest, text: str) -> bytes:
    """The one known run whose hex id starts with ``text``; 404 otherwise."""
    matches = [r for r in ingest.manifests if r.hex().startswith(text.lower())] if text else []
    if len(matches) != 1:
        raise ApiError(404, f"no single known run matches {text!r}")
    return matches[0]


def api_routes(node: Components) -> list[Route]:
    ingest, store, p2p, clock = node.ingest, node.ingest.store, node.p2p, node.ingest.clock

    def run_of(path: list[str]) -> bytes:
        return run_arg(ingest, path[0] if path else "")

    async def status(path, query):
        return node.status()

    async def peers(path, query):
        return [{"peer_id": p, "addrs": p2p.peer_addrs(p), "rejected": p2p.rejected.get(p, 0)}
                for p in p2p.connected_peers()]

    async def runs(path, query):
        out = []
        for m in ingest.manifests.values():
            item = views.run_json(m, str(store.run_dir(m.run_id) or "") or None)
            item["auditable"] = why_not_auditable(m) is None
            out.append(item)
        return out

    async def publish(path, query):
        if not query.get("dir"):
            raise ApiError(400, "publish needs ?dir=<run directory>")
        return node.publisher.start_publish(Path(query["dir"])).as_json()

    async def publications(path, query):
        jobs = node.publisher.publications
        if path:
            found = [j for run, j in jobs.items() if run.startswith(path[0].lower())]
            if len(found) != 1:
                raise ApiError(404, f"no single run matching {path[0]!r} was published by this node since it started")
            return found[0].as_json()
        return [j.as_json() for j in jobs.values()]

    async def fetch(path, query):
        run = run_of(path)
        step = query.get("step", "")
        if not step.isdigit() or int(step) >= ingest.manifests[run].steps:
            raise ApiError(400, "fetch needs ?step=<a step of the run>")
        try:
            work, _ = await node.auditor.run_files(ingest.manifests[run], int(step))
        except RunFilesError as exc:
            raise ApiError(404, str(exc)) from None
        return {"run": run.hex(), "step": int(step), "run_dir": str(work)}

    async def cov(path, query):
        run = run_of(path)
        try:
            redundancy = int(query.get("redundancy", node.config.redundancy))
            replay = ingest.coverage(run, redundancy)
            return {**views.coverage_json(replay, ingest.manifests[run]),
                    "evaluations": node.evaluator.status(ingest.manifests[run]),
                    "spot_checks": views.spot_json(ingest.spot_coverage(run, replay))}
        except ValueError as exc:
            raise ApiError(400, str(exc)) from exc

    async def attestations(path, query):
        run = run_of(path)
        step = query.get("step")
        if step is not None and not step.isdigit():
            raise ApiError(400, "step must be a non-negative integer")
        return [views.attestation_json(a, ms) for a, ms in store.attestations_received(run, int(step) if step else None)]

    async def reveals(path, query):
        return [views.reveal_json(r) for r in store.reveals(run_of(path))]

    async def claims(path, query):
        now = clock.wall()
        chosen = [run_of(path)] if path else list(ingest.manifests)
        return [views.claim_json(c, now) for run in chosen for c in store.claims(run, live_at=now)]

    async def shutdown(path, query):
        node.shutdown.set()
        return {"shutting_down": True}

    return [Route("GET", "/v1/status", status), Route("GET", "/v1/peers", peers), Route("GET", "/v1/runs", runs),
            Route("GET", "/v1/coverage", cov), Route("GET", "/v1/attestations", attestations),
            Route("GET", "/v1/claims", claims), Route("POST", "/v1/shutdown", shutdown),
            Route("GET", "/v1/reveals", reveals), reveal_route(node.identity, ingest, p2p),
            Route("POST", "/v1/publish", publish), Route("GET", "/v1/publications", publications),
            Route("POST", "/v1/fetch", fetch), *node.evaluator.routes()]


def reveal_route(identity: Identity, ingest: Ingest, gossip: Gossip) -> Route:
    """``POST /v1/reveal/<run>?step=&witness=``: a trainer publishing W_step after the audit
    (docs/run-format.md §5.2) — signed by this node, checked against the manifest, stored, gossiped."""
    clock = ingest.clock

    async def reveal(path, query):
        run = run_arg(ingest, path[0] if path else "")
        step, witness = query.get("step", ""), query.get("witness", "")
        if not step.isdigit() or len(witness) != 64 or any(c not in "0123456789abcdef" for c in witness.lower()):
            raise ApiError(400, "reveal needs ?step=<a step>&witness=<W_step as 64 hex digits>")
        made = WitnessReveal.create(identity, run=run, step=int(step), witness=bytes.fromhex(witness),
                                    issued_at=clock.wall())
        verdict = validate_reveal(made.encoded, ingest.manifest, clock.wall())
        if not verdict.accepted:
            raise ApiError(400, f"not a valid reveal: {verdict.reason}")
        if ingest.store.add_reveal(made):
            ingest.revealed(made)
        await gossip.publish(reveals_topic(run), made.encoded)
        return views.reveal_json(made)

    return Route("POST", "/v1/reveal", reveal)


def metrics_routes(node: Components) -> list[Route]:
    registry = metrics_registry(node.stats, node.gauges)

    async def metrics(path, query):
        return RawResponse("text/plain; version=0.0.4; charset=utf-8", render(registry))

    return [Route("GET", "/metrics", metrics)]
