"""The open1b-node daemon: learn runs, claim steps, replay them, attest, and answer queries.

Tasks (one trio nursery, all cancelled together on shutdown):

* gossip: per run, an attestations topic and a claims topic, each behind a validator from
  :mod:`open1b.protocol.validation` — nothing reaches the store unvalidated;
* bootstrap, then audit loop: pick a step (:mod:`.claims`), claim it (:mod:`.claiming`), replay
  it in the worker process (:mod:`.worker`), compare with the manifest, sign and publish;
* sync loop (:mod:`.sync`): periodically pull a peer's attestations, so messages missed on gossip
  (late joiners, restarts, mesh churn) still arrive; periodic peer discovery;
* local API (:mod:`.api`), and Prometheus metrics when configured (:mod:`.metrics`).
"""

from __future__ import annotations

import itertools
import logging
import platform
import random
import time
from collections import Counter
from pathlib import Path

import trio

from open1b.deterministic.runfile import read_manifest
from open1b.protocol import (
    MATCH, MISMATCH, Attestation, Claim, Coverage, Identity, Open1bError, Outcome, RunManifest, claim_key,
    coverage, peer_id_from_public_key, public_key_from_peer_id, select_claim, validate_attestation, validate_claim,
)
from open1b.protocol.claims import CLAIM_NAMESPACE

from . import adversary
from . import claims as planner
from . import views
from .api import ApiError, RawResponse, Route, serve_api
from .claiming import ClaimAgent
from .config import NodeConfig, split_hostport
from .datadir import DaemonLock, check_version
from .deficits import RunIndexes
from .identity_file import load_or_create_identity
from .metrics import Gauges, NodeStats, metrics_registry, render
from .p2p import NetworkError, P2P, RecordValidator, open_p2p
from .store import Store
from .sync import SYNC_PROTOCOL, pull_attestations, serve_sync
from .systemd import notify
from .worker import ReplayFailed, ReplayWorker

log = logging.getLogger("open1b.node")

MAX_DIALLED_PEERS = 32
DISCOVERY_EVERY_SYNC_ROUNDS = 10
SYNC_TIMEOUT_S = 10.0
API_ADDR_FILE = "api.addr"
P2P_ADDR_FILE = "p2p.addr"
STORE_FILE = "store.sqlite"


def now_s() -> int:
    return int(time.time())


def attestations_topic(run: bytes) -> str:
    return f"/open1b/1/run/{run.hex()}/attestations"


def claims_topic(run: bytes) -> str:
    return f"/open1b/1/run/{run.hex()}/claims"


class ClaimRecords(RecordValidator):
    """DHT validator for ``/open1b/claim/…``: a record must be a valid claim for its own key;
    among several, the protocol's strict total order picks one (invalid ones lose)."""

    def validate(self, key: str, value: bytes) -> None:
        claim = Claim.decode(value)
        if claim_key(claim.run, claim.step, claim.slot) != key:
            raise ValueError("claim stored under another key")

    def select(self, key: str, values: list[bytes]) -> int:
        parsed = []
        for value in values:
            try:
                parsed.append(Claim.decode(value))
            except Open1bError:
                parsed.append(None)
        valid = [i for i, c in enumerate(parsed) if c is not None]
        if not valid:
            return 0
        return valid[select_claim([parsed[i] for i in valid])]


class _DhtClaimBoard:
    """The claim agent's view of the network: DHT records plus the run's claims topic."""

    def __init__(self, p2p: P2P) -> None:
        self.p2p = p2p

    async def read(self, key: str) -> bytes | None:
        return await self.p2p.get_record(key, from_network=True)

    async def write(self, key: str, value: bytes) -> bool:
        return await self.p2p.put_record(key, value)

    async def announce(self, claim: Claim) -> None:
        await self.p2p.publish(claims_topic(claim.run), claim.encoded)


class Daemon:
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        config.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        check_version(config.data_dir, create=True)
        self.identity: Identity = load_or_create_identity(config.data_dir)
        self.stats = NodeStats()
        self.shutdown = trio.Event()
        self.bootstrapped = trio.Event()
        self.worker = ReplayWorker()
        self.hardware = f"{platform.machine()} {platform.system()} numba-cpu"
        self.p2p: P2P | None = None
        self.store: Store | None = None
        self.claimer: ClaimAgent | None = None
        self.manifests: dict[bytes, RunManifest] = {}
        self._topics: set[str] = set()
        self._failed: dict[bytes, set[int]] = {}  # steps whose replay failed here; not retried
        self.deficits = RunIndexes(self.identity.public_key, config.redundancy, self._load_run, now_s)
        self.trust = config.trust(self.identity.public_key)
        # Per run, the keys coverage flags (docs/protocol.md §8.1): the planner stops counting
        # their attestations too, so the steps they alone covered are replayed again.
        self.flagged: dict[bytes, frozenset[bytes]] = {}
        self._trust_stale: set[bytes] = set()  # runs with attestations not yet judged for flags
        self.validation: Counter[str] = Counter()  # "<kind>/<outcome>/<code>" of every statement refused
        self.adversary = adversary.from_config(config)  # None unless a devnet asked for broken behaviour

    # -- runs ------------------------------------------------------------------------------
    def manifest(self, run: bytes) -> RunManifest | None:
        return self.manifests.get(run)

    async def add_run(self, manifest: RunManifest, run_dir: Path | None) -> None:
        assert self.store is not None
        self.store.add_manifest(manifest, run_dir)
        self.manifests[manifest.run_id] = manifest
        await self._join_run_topics(manifest.run_id)

    async def _join_run_topics(self, run: bytes) -> None:
        assert self.p2p is not None
        for topic, validator, handler in (
            (attestations_topic(run), self._validate_attestation, self._on_attestation),
            (claims_topic(run), self._validate_claim, self._on_claim),
        ):
            if topic in self._topics:
                continue
            self._topics.add(topic)
            self.p2p.set_validator(topic, validator)
            await self.p2p.subscribe(topic, handler)

    # -- gossip validation and ingestion ---------------------------------------------------
    def _validate_attestation(self, author: str, data: bytes) -> Outcome:
        verdict = validate_attestation(data, self.manifest, now_s())
        self.stats.record_gossip("attestation", verdict.outcome.value)
        self._count_refusal("attestation", verdict)
        if verdict.outcome is not Outcome.ACCEPT:
            log.info("gossip attestation from %s: %s (%s)", author, verdict.outcome.value, verdict.reason)
        return verdict.outcome

    def _validate_claim(self, author: str, data: bytes) -> Outcome:
        verdict = validate_claim(data, self.manifest, now_s())
        self.stats.record_gossip("claim", verdict.outcome.value)
        self._count_refusal("claim", verdict)
        return verdict.outcome

    def _count_refusal(self, kind: str, verdict) -> None:
        if not verdict.accepted:
            self.validation[f"{kind}/{verdict.outcome.value}/{verdict.code}"] += 1

    def ingest_attestation(self, data: bytes, source: str | None = None) -> bool:
        """Validate and store one attestation from anywhere; True if it was new. ``source``: the
        peer a sync response came from — a provably invalid statement counts against it, as on gossip."""
        assert self.store is not None
        verdict = validate_attestation(data, self.manifest, now_s())
        if not verdict.accepted:
            if source is not None and self.p2p is not None:
                self._count_refusal("sync", verdict)
                if verdict.outcome is Outcome.REJECT:
                    self.p2p.penalise(source)
            return False
        added = self.store.add_attestation(verdict.message)
        if added:
            self.stats.attestations_received += 1
            self._stored(verdict.message)
        return added

    def _stored(self, att: Attestation) -> None:
        self._trust_stale.add(att.run)
        if self._plans_with(att):
            self.deficits.add_attestation(att)

    def _plans_with(self, att: Attestation) -> bool:
        """Whether the planner counts ``att``: our own always (we never attest a step twice);
        others' when the trust policy counts the key and coverage has not flagged it."""
        me = att.signer == self.identity.public_key
        return me or (self.trust.trusts(att.signer) and att.signer not in self.flagged.get(att.run, ()))

    async def _on_attestation(self, author: str, data: bytes) -> None:
        if not self.ingest_attestation(data):  # the validator accepted it: a statement we hold already
            self.validation["attestation/duplicate"] += 1

    async def _on_claim(self, author: str, data: bytes) -> None:
        verdict = validate_claim(data, self.manifest, now_s())
        if verdict.accepted:
            self._seen_claim(verdict.message)

    def _seen_claim(self, claim: Claim) -> None:
        if self.store is not None and claim.run in self.manifests:
            self.store.add_claim(claim)
            self.deficits.add_claim(claim)

    # -- coverage --------------------------------------------------------------------------
    def coverage(self, run: bytes, redundancy: int | None = None) -> Coverage:
        assert self.store is not None
        now = now_s()
        return coverage(
            self.manifests[run], self.store.attestations(run), self.store.claims(run, live_at=now),
            now=now, redundancy=redundancy or self.config.redundancy, policy=self.trust,
        )

    def refresh_flags(self) -> bool:
        """Re-judge flags for runs with new attestations; when a run's flagged keys change, the
        planner's indexes are rebuilt without (or again with) their attestations. True if any changed."""
        changed = False
        for run in list(self._trust_stale):
            self._trust_stale.discard(run)
            flagged = frozenset(public_key_from_peer_id(f.signer) for f in self.coverage(run).flagged)
            if flagged != self.flagged.get(run, frozenset()):
                log.warning("run %s: flagged keys now %s", run.hex()[:12],
                            sorted(peer_id_from_public_key(k) for k in flagged) or "none")
                self.flagged[run] = flagged
                changed = True
        if changed:
            self.deficits = RunIndexes(self.identity.public_key, self.config.redundancy, self._load_run, now_s)
        return changed

    async def _trust_loop(self) -> None:
        while True:
            await trio.sleep(1.0)
            self.refresh_flags()

    # -- claiming and replaying -------------------------------------------------------------
    def _load_run(self, run: bytes) -> tuple[int, list[Attestation], list[Claim]]:
        assert self.store is not None
        attestations = [a for a in self.store.attestations(run) if self._plans_with(a)]
        return self.manifests[run].steps, attestations, self.store.claims(run, live_at=now_s())

    def _next_candidates(self) -> list[tuple[RunManifest, planner.Candidate]]:
        # Incremental (node/deficits.py): no pass over every step or every stored statement.
        assert self.store is not None
        out = []
        for run, manifest in self.manifests.items():
            if self.store.run_dir(run) is None:
                continue  # we can only replay runs whose files we hold
            index = self.deficits.index(run)
            done_here = index.mine | self._failed.get(run, set())
            for cand in planner.pick(index, self.deficits.order(run), exclude=done_here):
                out.append((manifest, cand))
        return sorted(out, key=lambda item: item[1].order())

    async def _audit_loop(self) -> None:
        assert self.claimer is not None
        await self.bootstrapped.wait()
        while True:
            picked = None
            for manifest, cand in self._next_candidates()[:4]:
                claim = await self.claimer.try_claim(manifest.run_id, cand)
                if claim is not None:
                    picked = (manifest, claim)
                    break
            self.stats.claims_won, self.stats.claims_lost = self.claimer.won, self.claimer.lost
            if picked is None:
                await trio.sleep(self.config.idle_poll_s)
                continue
            await self._replay_and_attest(*picked)

    async def _replay_and_attest(self, manifest: RunManifest, claim: Claim) -> None:
        assert self.store is not None and self.p2p is not None and self.claimer is not None
        step = claim.step
        run_dir = self.store.run_dir(manifest.run_id)
        assert run_dir is not None
        self.stats.busy_step = step
        started = time.monotonic()
        failure: ReplayFailed | None = None
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.claimer.hold, claim)  # a replay may outlast one lease
                try:
                    result = await self._replay(manifest, run_dir, step)
                except ReplayFailed as exc:  # caught in here: a nursery would wrap it in a group
                    failure = exc
                nursery.cancel_scope.cancel()
        finally:
            self.stats.busy_step = None
        if failure is not None:
            self.stats.replay_failures += 1
            self._failed.setdefault(manifest.run_id, set()).add(step)
            log.warning("replay of step %d failed: %s", step, failure)
            return
        self.stats.record_replay(time.monotonic() - started)
        self.stats.replayed.append((manifest.run_id.hex(), step))
        if result.pre_state != manifest.state_hashes[step]:
            # The worker checked this already; a difference means a broken worker, not a verdict.
            self._failed.setdefault(manifest.run_id, set()).add(step)
            log.error("worker reported a foreign pre-state for step %d; not attesting", step)
            return
        expected = manifest.state_hashes[step + 1]
        att = Attestation.create(
            self.identity, run=manifest.run_id, step=step, pre_state=result.pre_state,
            post_state=result.post_state, verdict=MATCH if result.post_state == expected else MISMATCH,
            engine=manifest.engine, engine_version=manifest.engine_version, hardware=self.hardware,
            elapsed_ms=result.elapsed_ms, issued_at=now_s(),
        )
        self.store.add_attestation(att)
        self._stored(att)
        log.info("step %d of run %s: %s (%d ms)", step, manifest.run_id.hex()[:12], att.verdict, result.elapsed_ms)
        await self.p2p.publish(attestations_topic(manifest.run_id), att.encoded)

    async def _replay(self, manifest: RunManifest, run_dir: Path, step: int):
        if self.adversary is not None:  # a devnet's deliberately broken node
            return await self.adversary.replay(self, manifest, run_dir, step)
        return await self.worker.replay(run_dir, step, timeout_s=self.config.replay_timeout_s)

    # -- sync and peers --------------------------------------------------------------------
    def _attestations_for_sync(self, run: bytes) -> list[Attestation] | None:
        assert self.store is not None
        return self.store.attestations(run) if run in self.manifests else None

    async def sync_with(self, peer_id: str) -> int:
        assert self.p2p is not None
        new = 0
        for run in list(self.manifests):
            try:
                with trio.fail_after(SYNC_TIMEOUT_S):
                    new += await pull_attestations(self.p2p, peer_id, run,
                                                   lambda data: self.ingest_attestation(data, source=peer_id))
            except Exception as exc:  # libp2p raises many types for a peer's failure; never ours to die of
                log.debug("sync with %s failed: %s", peer_id, exc)
        self.stats.synced += new
        return new

    async def _sync_loop(self) -> None:
        assert self.p2p is not None
        for rounds in itertools.count(1):
            await trio.sleep(self.config.sync_interval_s)
            if rounds % DISCOVERY_EVERY_SYNC_ROUNDS == 0:
                await self.p2p.discover(MAX_DIALLED_PEERS)
            peers = self.p2p.connected_peers()
            if peers:
                await self.sync_with(random.choice(peers))

    async def _bootstrap(self) -> None:
        """Dial the bootstrap peers (retrying with backoff until one answers), discover more
        peers through the DHT, and pull what they already know — before auditing anything, so
        a node that starts late does not redo finished work or miss live claims."""
        assert self.p2p is not None
        pending = list(self.config.bootstrap)
        delay = 0.2
        # Until a bootstrap peer answers or some other peer has dialled us: a node whose only
        # bootstrap peer crashed must not wait for it while its other peers carry on.
        while pending and len(pending) == len(self.config.bootstrap) and not self.p2p.connected_peers():
            for addr in list(pending):
                try:
                    await self.p2p.connect(addr)
                    pending.remove(addr)
                except NetworkError as exc:
                    log.info("bootstrap: %s", exc)
            if len(pending) == len(self.config.bootstrap):
                await trio.sleep(delay)
                delay = min(delay * 2, 10.0)
        dialled = await self.p2p.discover(MAX_DIALLED_PEERS)
        log.info("bootstrapped: %d peers connected (%d discovered)", len(self.p2p.connected_peers()), len(dialled))
        for peer in self.p2p.connected_peers():
            await self.sync_with(peer)
        self.bootstrapped.set()

    # -- API -------------------------------------------------------------------------------
    def _run_arg(self, text: str) -> bytes:
        matches = [r for r in self.manifests if r.hex().startswith(text.lower())] if text else []
        if len(matches) != 1:
            raise ApiError(404, f"no single known run matches {text!r}")
        return matches[0]

    def gauges(self) -> Gauges:
        assert self.store is not None and self.p2p is not None
        return Gauges(self.store.attestation_count(), len(self.p2p.connected_peers()), len(self.p2p.banned),
                      len(self.manifests))

    def status(self) -> dict:
        assert self.p2p is not None
        s, g = self.stats, self.gauges()
        return {
            "peer_id": self.p2p.peer_id, "addrs": self.p2p.addrs, "peers": self.p2p.connected_peers(),
            "runs": [r.hex() for r in self.manifests], "audit": self.config.audit,
            "redundancy": self.config.redundancy, "attestations_stored": g.attestations_stored,
            "replays": s.replays, "replay_failures": s.replay_failures, "claims_won": s.claims_won,
            "claims_lost": s.claims_lost, "gossip_rejected": s.gossip_count("reject"),
            "gossip_ignored": s.gossip_count("ignore"), "synced": s.synced, "peers_banned": g.peers_banned,
            "replaying_step": s.busy_step, "replayed": s.replayed,
            "trust_policy": self.trust.name, "validation": dict(sorted(self.validation.items())),
            "banned": sorted(self.p2p.banned), "penalties": dict(sorted(self.p2p.rejected.items())),
            "behaviour": self.config.behaviour or None,
        }

    def routes(self) -> list[Route]:
        assert self.store is not None and self.p2p is not None
        store, p2p = self.store, self.p2p

        async def status(path, query):
            return self.status()

        async def peers(path, query):
            return [{"peer_id": p, "addrs": p2p.peer_addrs(p), "rejected": p2p.rejected.get(p, 0)}
                    for p in p2p.connected_peers()]

        async def runs(path, query):
            return [views.run_json(m, str(store.run_dir(m.run_id) or "") or None) for m in self.manifests.values()]

        async def cov(path, query):
            run = self._run_arg(path[0] if path else "")
            try:
                redundancy = int(query.get("redundancy", self.config.redundancy))
                return views.coverage_json(self.coverage(run, redundancy), self.manifests[run])
            except ValueError as exc:
                raise ApiError(400, str(exc)) from exc

        async def attestations(path, query):
            run = self._run_arg(path[0] if path else "")
            step = query.get("step")
            if step is not None and not step.isdigit():
                raise ApiError(400, "step must be a non-negative integer")
            return [views.attestation_json(a, ms) for a, ms in store.attestations_received(run, int(step) if step else None)]

        async def claims(path, query):
            now = now_s()
            runs = [self._run_arg(path[0])] if path else list(self.manifests)
            return [views.claim_json(c, now) for run in runs for c in store.claims(run, live_at=now)]

        async def shutdown(path, query):
            self.shutdown.set()
            return {"shutting_down": True}

        return [Route("GET", "/v1/status", status), Route("GET", "/v1/peers", peers), Route("GET", "/v1/runs", runs),
                Route("GET", "/v1/coverage", cov), Route("GET", "/v1/attestations", attestations),
                Route("GET", "/v1/claims", claims), Route("POST", "/v1/shutdown", shutdown)]

    def metrics_routes(self) -> list[Route]:
        registry = metrics_registry(self.stats, self.gauges)

        async def metrics(path, query):
            return RawResponse("text/plain; version=0.0.4; charset=utf-8", render(registry))

        return [Route("GET", "/metrics", metrics)]

    # -- main ------------------------------------------------------------------------------
    async def run(self) -> None:
        cfg = self.config
        listen_host, listen_port = split_hostport(cfg.listen)
        with DaemonLock(cfg.data_dir):
            self.store = Store(cfg.data_dir / STORE_FILE)
            try:
                self.manifests = {m.run_id: m for m in self.store.manifests()}
                async with open_p2p(self.identity, listen_host, listen_port, heartbeat_s=cfg.heartbeat_s,
                                    max_rejects_per_peer=cfg.max_rejects_per_peer) as p2p:
                    await self._serve(p2p)
            finally:
                await self.worker.aclose()
                self.store.close()

    async def _serve(self, p2p: P2P) -> None:
        cfg = self.config
        self.p2p = p2p
        self.claimer = ClaimAgent(self.identity, _DhtClaimBoard(p2p), lease_s=cfg.lease_s, clock=now_s,
                                  sleep=trio.sleep, seen=self._seen_claim)
        p2p.register_record_validator(CLAIM_NAMESPACE, ClaimRecords())
        p2p.set_stream_handler(SYNC_PROTOCOL, lambda stream: serve_sync(stream, self._attestations_for_sync))
        for run in list(self.manifests):
            await self._join_run_topics(run)
        for run_dir in cfg.run_dirs:
            await self.add_run(read_manifest(run_dir), run_dir.resolve())
        async with trio.open_nursery() as nursery:
            api_host, api_port = split_hostport(cfg.api)
            api_port = await nursery.start(serve_api, api_host, api_port, self.routes())
            if cfg.metrics:
                metrics_host, metrics_port = split_hostport(cfg.metrics)
                metrics_port = await nursery.start(serve_api, metrics_host, metrics_port, self.metrics_routes())
                log.info("metrics on http://%s:%d/metrics", metrics_host, metrics_port)
            _write_addr(cfg.data_dir / API_ADDR_FILE, f"{api_host}:{api_port}")
            _write_addr(cfg.data_dir / P2P_ADDR_FILE, p2p.addrs[0])
            log.info("node %s listening on %s, API on %s:%d", p2p.peer_id, p2p.addrs[0], api_host, api_port)
            notify("READY=1")
            nursery.start_soon(self._bootstrap)
            nursery.start_soon(self._sync_loop)
            nursery.start_soon(self._trust_loop)
            if cfg.audit:
                nursery.start_soon(self._audit_loop)
            if self.adversary is not None:
                nursery.start_soon(self.adversary.run, self)
            await self.shutdown.wait()
            log.info("shutting down")
            notify("STOPPING=1")
            nursery.cancel_scope.cancel()
        for name in (API_ADDR_FILE, P2P_ADDR_FILE):
            (cfg.data_dir / name).unlink(missing_ok=True)


def _write_addr(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text + "\n")
    tmp.replace(path)
