"""The local API's routes, as one FastAPI app (served by :mod:`.api` behind its guard): status,
peers, runs, coverage, statements, claims, evidence, evaluations and the leaderboard
(:mod:`.evaluator`) to read; publish, fetch, reveal and shutdown
to act; the web page (:mod:`.web`) at ``/``. Each handler reads the components it was given and
renders with :mod:`.views`; a refused request raises :class:`~.api.ApiError`.

Query parameters are typed and bounded in the route signatures, so a bad one is a 422 naming it
(never a 500), and the OpenAPI document (``/v1/openapi.json``, kept in docs/openapi.json) comes
from these definitions.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, AsyncIterator, Mapping

import cbor2
import trio
from fastapi import FastAPI, Query, Request
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException

from open1b.protocol import MAX_EVAL_SIZE, Identity, RunManifest, WitnessReveal, peer_id_from_public_key
from open1b.protocol.coverage import OPEN
from open1b.protocol.validation import validate_reveal

from . import views
from .api import ApiError, ApiGuard
from .clock import Clock
from .config import NodeConfig, split_hostport
from .doctor import run_checks
from .evaluator import Evaluator
from .fetcher import Fetcher
from .fraud_proof_store import BodyDropped
from .ledger import Ledger
from .metrics import Gauges, NodeStats, metrics_registry, render
from .outbox import StatementOutbox
from .p2p import FRAME_PIECE, P2P
from .publisher import Publisher
from .reachability import ReachabilityMonitor
from .runs import RunFiles, RunFilesError, why_not_auditable
from .spot_checker import why_not_spot_checked
from .web import mount_page
from .worker import ReplayWorker

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Components:
    """What the routes read: the daemon's components."""

    identity: Identity
    config: NodeConfig
    clock: Clock
    p2p: P2P
    ledger: Ledger
    publisher: Publisher
    fetcher: Fetcher
    runfiles: RunFiles
    stats: NodeStats
    worker: ReplayWorker
    shutdown: trio.Event
    evaluator: Evaluator
    reachability: ReachabilityMonitor

    def gauges(self) -> Gauges:
        f, cache = self.runfiles.stats, self.runfiles.cache
        ledger, network, bulk = self.ledger, self.p2p.relays.status(), self.runfiles.bulk
        punches = network["hole_punches"]
        return Gauges(ledger.store.attestation_count(), len(self.p2p.connected_peers()), len(self.p2p.banned),
                      len(ledger.manifests), blobs_fetched=f.fetched, blob_fetch_failures=f.failed,
                      blob_fetched_bytes=f.fetched_bytes, blob_served_bytes=cache.served_bytes,
                      blob_bad_providers=f.bad_providers, blob_cache_bytes=cache.used_bytes(),
                      trusted_listed=len(ledger.counting.listed.roots), trusted_earned=len(ledger.counting.earned),
                      reachability=self.reachability.current.state,
                      relay_reservations_held=len(network["reserved_on"]),
                      relay_reservations_served=network["relay_reservations_served"],
                      relay_refused_not_public=network["relay_requests_refused"],
                      relay_refused_full=network["relay_reservations_refused_full"],
                      hole_punches_attempted=punches["attempts"], hole_punches_succeeded=punches["succeeded"],
                      hole_punches_answered=punches["answered"],
                      bulk_dialbacks_served=bulk.dialled_back if bulk is not None else 0,
                      bulk_dialbacks_refused=bulk.dialbacks_refused if bulk is not None else 0)

    def status(self) -> dict:
        s, g, ledger, p2p = self.stats, self.gauges(), self.ledger, self.p2p
        return {
            "peer_id": p2p.peer_id, "addrs": p2p.addrs, "peers": p2p.connected_peers(),
            "reachability": self.reachability.current.as_json(),
            "network": {**p2p.relays.status(), "dht_mode": "client" if p2p.dht.client else "server"},
            "runs": [r.hex() for r in ledger.manifests], "audit": self.config.audit,
            "redundancy": self.config.redundancy, "attestations_stored": g.attestations_stored,
            "replays": s.replays, "replay_failures": s.replay_failures, "claims_won": s.claims_won,
            "device": {"requested": self.worker.device_spec, "class": self.worker.device,
                       "reason": self.worker.device_reason},
            "claims_lost": s.claims_lost, "gossip_rejected": s.gossip_count("reject"),
            "gossip_ignored": s.gossip_count("ignore"), "synced": s.synced, "peers_banned": g.peers_banned,
            "replaying_step": s.busy_step, "replayed": s.replayed,
            "trust_policy": ledger.counting.trust.name,
            "validation": dict(sorted(ledger.statements.validation.items())),
            "banned": sorted(p2p.banned), "penalties": dict(sorted(p2p.rejected.items())),
            "gossip_validator_errors": p2p.validator_errors,  # our bugs: ignored, nobody penalised (p2p.py)
            "reveals_made": ledger.proof.revealed,
            "witness_commitment_mismatches": ledger.proof.commitment_mismatches,
            "runs_synced": ledger.statements.runs_synced, "blobs": self.blob_status(),
            "own_statements": {f"{k}/{o}": n for (k, o), n in sorted(s.own_statements.items())},
            "spot_checks": {"signed": {f"{v}/{c}": n for (v, c), n in sorted(s.spot_checks.items())},
                            "failed_to_run": s.spot_failures, "challenges_answered": s.challenges_answered},
            "disputes": {"outcomes": {f"{role}/{outcome}": n for (role, outcome), n in sorted(s.disputes.items())},
                         "recent": list(s.recent_disputes), "proof_fetches": dict(sorted(s.proof_fetches.items()))},
        }

    def blob_status(self) -> dict:
        f, cache = self.runfiles.stats, self.runfiles.cache
        return {"fetched": f.fetched, "bulk_fetched": f.bulk_fetched, "fetched_bytes": f.fetched_bytes,
                "fetch_failures": f.failed,
                "bad_providers": f.bad_providers, "served_bytes": cache.served_bytes,
                "refused_relayed": cache.relayed_refused, "sources": list(f.sources),
                "cache_bytes": cache.used_bytes(), "cache_limit": cache.max_bytes, "pinned": len(cache.pinned),
                "fetching": {name: {"done": d, "total": t} for name, (d, t) in f.in_flight.items()}}


API_VERSION = "1"
MAX_STEP = 2**63 - 1  # a step index SQLite can hold; larger ones are refused by the schema
MAX_REDUNDANCY = 1024
EVENTS_POLL_S = 1.0  # how often /v1/events looks for a change
# A comment line on the event stream after this long without an event: a proxy between the page
# and the node (nginx waits 60 s by default) must not take a quiet stream for a dead one.
EVENTS_KEEPALIVE_S = 10.0

RunId = Annotated[str, PathParam(min_length=1, max_length=64, pattern="^[0-9a-fA-F]+$",
                                 description="a run id, or a unique prefix of one (hex)")]
Step = Annotated[int, Query(ge=0, le=MAX_STEP, description="a step of the run")]
Redundancy = Annotated[int | None, Query(ge=1, le=MAX_REDUNDANCY,
                                         description="distinct attesters a step needs (default: the node's)")]
Digest = Annotated[str, PathParam(min_length=64, max_length=64, pattern="^[0-9a-fA-F]{64}$",
                                  description="B2 of the encoded fraud proof, as 64 hex digits")]
Witness = Annotated[str, Query(min_length=64, max_length=64, pattern="^[0-9a-fA-F]{64}$",
                               description="W_step as 64 hex digits")]


def run_arg(runs: Mapping[bytes, RunManifest], text: str) -> bytes:
    """The one known run whose hex id starts with ``text``; 404 otherwise."""
    matches = [r for r in runs if r.hex().startswith(text.lower())] if text else []
    if len(matches) != 1:
        raise ApiError(404, f"no single known run matches {text!r}")
    return matches[0]


def step_arg(runs: Mapping[bytes, RunManifest], run: bytes, step: int) -> int:
    if step >= runs[run].steps:
        raise ApiError(400, f"step {step} is not a step of run {run.hex()[:16]}")
    return step


def api_app(node: Components, *, token: str) -> ApiGuard:
    """The whole API, behind :class:`~.api.ApiGuard` (Host, Origin and token checks)."""
    app = FastAPI(title="open1b node API", version=API_VERSION, openapi_url="/v1/openapi.json", docs_url=None,
                  redoc_url=None, description="The local API of an open1b node (docs/api.md).")
    ledger, p2p, clock = node.ledger, node.p2p, node.clock
    known, store, judge = ledger.manifests, ledger.store, ledger.judge

    @app.exception_handler(ApiError)
    async def refused(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return JSONResponse({"error": f"{where}: {first['msg']}"}, status_code=422)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code)

    @app.get("/v1/status", summary="the node's status")
    async def status() -> dict:
        return node.status()

    @app.get("/v1/peers", summary="connected peers, and the banned and trusted keys")
    async def peers() -> list[dict]:
        policy = ledger.counting.trust
        trusted = {peer_id_from_public_key(k) for k in policy.roots}
        return [{"peer_id": p, "addrs": p2p.peer_addrs(p), "rejected": p2p.rejected.get(p, 0),
                 "trusted": policy.name == OPEN or p in trusted} for p in p2p.connected_peers()]

    @app.get("/v1/runs", summary="runs the node knows")
    async def runs() -> list[dict]:
        out = []
        for m in known.values():
            item = views.run_json(m, str(store.run_dir(m.run_id) or "") or None)
            item["auditable"] = why_not_auditable(m) is None
            item["spot_checkable"] = why_not_spot_checked(m) is None
            out.append(item)
        return out

    @app.get("/v1/coverage/{run}", summary="a run's coverage: per step, who attested what")
    async def cov(run: RunId, redundancy: Redundancy = None) -> dict:
        run_id = run_arg(known, run)
        manifest = known[run_id]
        replay = judge.coverage(run_id, redundancy)
        return {**views.coverage_json(replay, manifest, ledger.counting.earned),
                "evaluations": node.evaluator.status(manifest),
                "spot_checks": views.spot_json(judge.spot_coverage(run_id, replay), why_not_spot_checked(manifest))}

    @app.get("/v1/attestations/{run}", summary="the signed attestations of a run (or of one step)")
    async def attestations(run: RunId, step: Annotated[int | None, Query(ge=0, le=MAX_STEP)] = None) -> list[dict]:
        return [views.attestation_json(a, ms) for a, ms in store.attestations_received(run_arg(known, run), step)]

    @app.get("/v1/reveals/{run}", summary="the witness reveals of a run")
    async def reveals(run: RunId) -> list[dict]:
        return [views.reveal_json(r) for r in store.reveals(run_arg(known, run))]

    @app.get("/v1/spotchecks/{run}", summary="the signed spot checks of a run (or of one step)")
    async def spotchecks(run: RunId, step: Annotated[int | None, Query(ge=0, le=MAX_STEP)] = None) -> list[dict]:
        return [views.spotcheck_json(sc) for sc in store.spotchecks(run_arg(known, run)) if step in (None, sc.step)]

    @app.get("/v1/disputes/{run}", summary="a run's fraud proofs the referee accepted: who is guilty, of which op")
    async def disputes(run: RunId) -> list[dict]:
        return [f.to_json() for f in store.fraud.of_run(run_arg(known, run))]

    @app.get("/v1/disputes/{run}/{digest}", summary="one fraud proof's bytes, by its digest (open1b-node dispute verify "
             "judges them)", response_class=Response, responses={200: {"content": {"application/cbor": {}}}})
    async def fraud_proof(run: RunId, digest: Digest) -> StreamingResponse:
        run_id, key = run_arg(known, run), bytes.fromhex(digest)
        with store.fraud.open_body(run_id, key) as body:
            if body is None:
                raise HTTPException(404, "no such fraud proof")
            size = body.nbytes

        async def pieces() -> AsyncIterator[bytes]:
            # Opened again here, where the generator's end closes it however the response ends: a
            # body is up to 128 MiB, read a piece at a time from the store, never whole. The same
            # digest is the same bytes; a body dropped since ends the response short of its length
            # (the server then closes the connection: the client sees a truncated body).
            try:
                with store.fraud.open_body(run_id, key) as again:
                    if again is None:
                        raise BodyDropped("the stored fraud proof was dropped before it was sent")
                    for offset in range(0, size, FRAME_PIECE):
                        yield again.read(offset, FRAME_PIECE)
            except BodyDropped as exc:
                log.info("fraud proof %s not sent whole: %s", digest, exc)

        return StreamingResponse(pieces(), media_type="application/cbor", headers={"content-length": str(size)})

    @app.get("/v1/evidence/{run}", summary="a step's signed statements as raw bytes (a CBOR list of them)",
             response_class=Response, responses={200: {"content": {"application/cbor": {}}}})
    async def evidence(run: RunId, step: Step) -> Response:
        run_id = run_arg(known, run)
        k = step_arg(known, run_id, step)
        statements = ([a.encoded for a in store.attestations(run_id, k)] + [r.encoded for r in store.reveals(run_id, k)]
                      + [sc.encoded for sc in store.spotchecks(run_id) if sc.step == k])
        name = f"open1b-evidence-{run_id.hex()[:16]}-step{k}.cbor"
        return Response(cbor2.dumps(statements, canonical=True), media_type="application/cbor",
                        headers={"content-disposition": f'attachment; filename="{name}"'})

    @app.get("/v1/claims", summary="live claims on every run")
    async def all_claims() -> list[dict]:
        now = clock.wall()
        return [views.claim_json(c, now) for r in list(known) for c in store.claims(r, live_at=now)]

    @app.get("/v1/claims/{run}", summary="live claims on a run")
    async def claims(run: RunId) -> list[dict]:
        now = clock.wall()
        return [views.claim_json(c, now) for c in store.claims(run_arg(known, run), live_at=now)]

    @app.get("/v1/publications", summary="publish jobs since the daemon started")
    async def publications() -> list[dict]:
        return [j.as_json() for j in node.publisher.publications.values()]

    @app.get("/v1/publications/{run}", summary="one publish job")
    async def publication(run: RunId) -> dict:
        found = [j for r, j in node.publisher.publications.items() if r.startswith(run.lower())]
        if len(found) != 1:
            raise ApiError(404, f"no single run matching {run!r} was published by this node since it started")
        return found[0].as_json()

    @app.post("/v1/publish", summary="publish a run directory (token)")
    async def publish(dir: Annotated[str, Query(min_length=1, max_length=4096, description="a run directory")],
                      move: Annotated[bool, Query(description="rename the files into the blob cache, not copy")] = False
                      ) -> dict:
        return (await node.publisher.publish_dir(Path(dir), move=move)).as_json()

    @app.post("/v1/fetch/{run}", summary="fetch a step's files for a local replay, held until deleted (token)")
    async def fetch(run: RunId, step: Step) -> dict:
        run_id = run_arg(known, run)
        k = step_arg(known, run_id, step)
        try:
            work = await node.fetcher.for_operator(known[run_id], k)
        except RunFilesError as exc:
            raise ApiError(404, str(exc)) from None
        return {"run": run_id.hex(), "step": k, "run_dir": str(work)}

    @app.delete("/v1/fetch/{run}", summary="a local replay is done with the step's files (token)")
    async def fetch_done(run: RunId, step: Step) -> dict:
        run_id = run_arg(known, run)
        k = step_arg(known, run_id, step)
        return {"run": run_id.hex(), "step": k, "released": node.fetcher.release_operator(known[run_id], k)}

    @app.post("/v1/reveal/{run}", summary="publish a replay witness after the audit (token)")
    async def reveal(run: RunId, step: Step, witness: Witness) -> dict:
        run_id = run_arg(known, run)
        return await make_reveal(node.identity, known, ledger.outbox, clock, run_id, step_arg(known, run_id, step),
                                 bytes.fromhex(witness))

    @app.get("/v1/events", summary="server-sent events: `change` whenever the node's statements, runs or peers change",
             response_class=StreamingResponse, responses={200: {"content": {"text/event-stream": {}}}})
    async def events() -> StreamingResponse:
        async def changes() -> AsyncIterator[str]:
            last, sent = None, clock.now()
            while True:
                now = (store.attestation_count(), len(known), len(p2p.connected_peers()), len(p2p.banned))
                if now != last:
                    yield f"event: change\ndata: {now[0]} attestations, {now[1]} runs, {now[2]} peers\n\n"
                    last, sent = now, clock.now()
                elif clock.now() - sent >= EVENTS_KEEPALIVE_S:
                    yield ": keep-alive\n\n"
                    sent = clock.now()
                await clock.sleep(EVENTS_POLL_S)

        return StreamingResponse(changes(), media_type="text/event-stream", headers={"cache-control": "no-store"})

    @app.post("/v1/doctor", summary="run the doctor's checks on this machine and node (token: it starts work)")
    async def doctor() -> list[dict]:
        checks = await trio.to_thread.run_sync(run_checks, node.config.data_dir, node.status())
        return [c.as_json() for c in checks]

    @app.get("/v1/leaderboard", summary="runs ranked by certified evaluation loss (docs/protocol.md §8.6)")
    async def leaderboard() -> list[dict]:
        return node.evaluator.leaderboard_json()

    @app.get("/v1/evaluations/{run}", summary="a run's evaluations: certified, disputed or unchecked, per state")
    async def evaluations(run: RunId) -> list[dict]:
        return node.evaluator.status(known[run_arg(known, run)])

    @app.get("/v1/evals/{run}", summary="a run's signed eval statements (hex)")
    async def evals(run: RunId) -> list[str]:
        return [e.encoded.hex() for e in store.evals(run_arg(known, run))]

    @app.post("/v1/eval", summary="submit a signed eval statement (token)")
    async def submit_eval(statement: Annotated[str, Query(min_length=2, max_length=2 * MAX_EVAL_SIZE,
                                                          pattern="^([0-9a-fA-F]{2})+$",
                                                          description="the signed statement as hex")]) -> dict:
        return {"digest": (await node.evaluator.submit(bytes.fromhex(statement))).digest.hex()}

    @app.post("/v1/shutdown", summary="stop the daemon (token)")
    async def shutdown() -> JSONResponse:
        async def stop() -> None:
            node.shutdown.set()

        # set only once the answer is sent: stopping cancels the server, and the caller should hear back
        return JSONResponse({"shutting_down": True}, background=BackgroundTask(stop))

    mount_page(app)
    cors(app, node.config.api_origins)
    return ApiGuard(app, token=token, bound_host=split_hostport(node.config.api)[0], origins=node.config.api_origins)


def cors(app: FastAPI, origins: tuple[str, ...]) -> None:
    """CORS headers for the origins the operator configured, and for no one else."""
    if origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(origins), allow_methods=["GET", "POST"],
                           allow_headers=["authorization"])


async def make_reveal(identity: Identity, runs: Mapping[bytes, RunManifest], outbox: StatementOutbox, clock: Clock,
                      run: bytes, step: int, witness: bytes) -> dict:
    """A trainer publishing W_step after the audit (docs/run-format.md §5.2): signed by this node,
    checked against the manifest, then stored and gossiped (the outbox)."""
    made = WitnessReveal.create(identity, run=run, step=step, witness=witness, issued_at=clock.wall())
    verdict = validate_reveal(made.encoded, runs.get, clock.wall())
    if not verdict.accepted:
        raise ApiError(400, f"not a valid reveal: {verdict.reason}")
    await outbox.publish(made)
    return views.reveal_json(made)


def metrics_app(node: Components) -> FastAPI:
    """Prometheus metrics, on their own address (off by default)."""
    registry = metrics_registry(node.stats, node.gauges)
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(render(registry), media_type="text/plain; version=0.0.4; charset=utf-8")

    return app
