"""The open1b-node daemon: learn runs, claim steps, replay them, attest, and answer queries.

Tasks (one trio nursery, all cancelled together on shutdown):

* gossip: per run, an attestations topic and a claims topic, each behind a validator from
  :mod:`open1b.protocol.validation` — nothing reaches the store unvalidated;
* audit loop: pick a step (:mod:`.claims`), claim it in the DHT, re-check the claim, replay it
  in a worker process, compare with the manifest, sign and publish the attestation;
* sync loop: periodically pull a peer's attestations over a stream, so messages missed on
  gossip (late joiners, restarts, mesh churn) still arrive;
* bootstrap loop: keep dialling configured peers until connected;
* local API (:mod:`.api`).
"""

from __future__ import annotations

import itertools
import logging
import platform
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import trio

from open1b.deterministic.runfile import read_manifest
from open1b.protocol import (
    MATCH, MISMATCH, Attestation, Claim, Coverage, Identity, Open1bError, Outcome, RunManifest, StepStatus,
    claim_key, coverage, public_key_from_peer_id, select_claim, validate_attestation, validate_claim,
)
from open1b.protocol.claims import CLAIM_NAMESPACE, MAX_LEASE_SECONDS
from open1b.protocol.codec import decode, encode
from open1b.protocol.messages import MAX_ATTESTATION_SIZE

from . import claims as planner
from .api import ApiError, Route, serve_api
from .identity_file import load_or_create_identity
from .p2p import NetworkError, P2P, RecordValidator, Stream, open_p2p
from .store import Store
from .worker import ReplayFailed, ReplayWorker

log = logging.getLogger("open1b.node")

SYNC_PROTOCOL = "/open1b/sync/1.0.0"
MAX_SYNC_REQUEST = 256
MAX_SYNC_STATEMENTS = 100_000
MAX_DIALLED_PEERS = 32
DISCOVERY_EVERY_SYNC_ROUNDS = 10
API_ADDR_FILE = "api.addr"
P2P_ADDR_FILE = "p2p.addr"


def now_s() -> int:
    return int(time.time())


def attestations_topic(run: bytes) -> str:
    return f"/open1b/1/run/{run.hex()}/attestations"


def claims_topic(run: bytes) -> str:
    return f"/open1b/1/run/{run.hex()}/claims"


@dataclass(frozen=True)
class NodeConfig:
    data_dir: Path
    listen_host: str = "127.0.0.1"
    listen_port: int = 0
    api_host: str = "127.0.0.1"
    api_port: int = 0
    bootstrap: tuple[str, ...] = ()
    run_dirs: tuple[Path, ...] = ()
    audit: bool = True
    redundancy: int = 1
    lease_s: int = 120
    replay_timeout_s: float = 600.0
    sync_interval_s: float = 2.0
    idle_poll_s: float = 0.5
    heartbeat_s: float = 1.0

    def __post_init__(self) -> None:
        if not 1 <= self.lease_s <= MAX_LEASE_SECONDS:
            raise ValueError(f"lease_s must be in [1, {MAX_LEASE_SECONDS}]")
        if self.redundancy < 1:
            raise ValueError("redundancy must be at least 1")


@dataclass
class Counters:
    replays: int = 0
    replay_failures: int = 0
    claims_won: int = 0
    claims_lost: int = 0
    attestations_received: int = 0
    gossip_rejected: int = 0
    gossip_ignored: int = 0
    synced: int = 0
    busy_step: int | None = None
    replayed: list[tuple[str, int]] = field(default_factory=list)


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


class Daemon:
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        config.data_dir.mkdir(parents=True, exist_ok=True)
        self.identity: Identity = load_or_create_identity(config.data_dir)
        self.store = Store(config.data_dir / "store.sqlite")
        self.manifests: dict[bytes, RunManifest] = {m.run_id: m for m in self.store.manifests()}
        self.counters = Counters()
        self.p2p: P2P | None = None
        self.shutdown = trio.Event()
        self.bootstrapped = trio.Event()
        self.worker = ReplayWorker()
        self._topics: set[str] = set()
        self._failed: dict[bytes, set[int]] = {}  # steps whose replay failed here; not retried
        self.hardware = f"{platform.machine()} {platform.system()} numba-cpu"

    # -- runs ------------------------------------------------------------------------------
    def manifest(self, run: bytes) -> RunManifest | None:
        return self.manifests.get(run)

    async def add_run(self, manifest: RunManifest, run_dir: Path | None) -> None:
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
    def _count(self, outcome: Outcome) -> None:
        if outcome is Outcome.REJECT:
            self.counters.gossip_rejected += 1
        elif outcome is Outcome.IGNORE:
            self.counters.gossip_ignored += 1

    def _validate_attestation(self, author: str, data: bytes) -> Outcome:
        verdict = validate_attestation(data, self.manifest, now_s())
        self._count(verdict.outcome)
        if verdict.outcome is not Outcome.ACCEPT:
            log.info("gossip attestation from %s: %s (%s)", author, verdict.outcome.value, verdict.reason)
        return verdict.outcome

    def _validate_claim(self, author: str, data: bytes) -> Outcome:
        verdict = validate_claim(data, self.manifest, now_s())
        self._count(verdict.outcome)
        return verdict.outcome

    def ingest_attestation(self, data: bytes) -> bool:
        """Validate and store one attestation from anywhere; True if it was new."""
        verdict = validate_attestation(data, self.manifest, now_s())
        if not verdict.accepted:
            return False
        added = self.store.add_attestation(verdict.message)
        if added:
            self.counters.attestations_received += 1
        return added

    async def _on_attestation(self, author: str, data: bytes) -> None:
        self.ingest_attestation(data)

    async def _on_claim(self, author: str, data: bytes) -> None:
        verdict = validate_claim(data, self.manifest, now_s())
        if verdict.accepted:
            self.store.add_claim(verdict.message)

    # -- coverage --------------------------------------------------------------------------
    def coverage(self, run: bytes, redundancy: int | None = None) -> Coverage:
        manifest = self.manifests[run]
        now = now_s()
        return coverage(
            manifest, self.store.attestations(run), self.store.claims(run, live_at=now),
            now=now, redundancy=redundancy or self.config.redundancy,
        )

    # -- claiming and replaying -------------------------------------------------------------
    async def _read_claim(self, key: str) -> Claim | None:
        assert self.p2p is not None
        value = await self.p2p.get_record(key, from_network=True)
        if value is None:
            return None
        try:
            return Claim.decode(value)
        except Open1bError:
            return None

    async def _try_claim(self, manifest: RunManifest, cov: Coverage, step: int) -> bool:
        """Claim a free redundancy slot of ``step``; True only if the DHT then shows our claim."""
        assert self.p2p is not None
        status = cov.steps[step]
        attesters = set(status.auditors) | set(status.dissenters)
        slots = planner.target_attesters(status.status, cov.redundancy)
        now = now_s()
        records = {s: await self._read_claim(claim_key(manifest.run_id, step, s)) for s in range(slots)}
        for rec in records.values():
            if rec is not None:
                self.store.add_claim(rec)
        slot = planner.free_slot(records, slots, me=self.identity.public_key, attesters=attesters, now=now)
        if slot is None:
            return False
        mine = records.get(slot)
        if mine is None or mine.claimant != self.identity.public_key or not mine.lease_expiry > now + 5:
            mine = Claim.create(self.identity, run=manifest.run_id, step=step, slot=slot, issued_at=now,
                                lease_expiry=now + self.config.lease_s)
            self.store.add_claim(mine)
            key = claim_key(manifest.run_id, step, slot)
            if not await self.p2p.put_record(key, mine.encoded):
                self.counters.claims_lost += 1
                return False
            await self.p2p.publish(claims_topic(manifest.run_id), mine.encoded)
            # Re-check before spending compute: a concurrent claim may have won the order.
            await trio.sleep(random.uniform(0.05, 0.2))
            current = await self._read_claim(key)
            if current is not None and current.digest != mine.digest:
                self.store.add_claim(current)
                self.counters.claims_lost += 1
                return False
        self.counters.claims_won += 1
        return True

    def _next_candidates(self) -> list[tuple[RunManifest, Coverage, planner.Candidate]]:
        out = []
        peers = [self._peer_key(p) for p in self.p2p.connected_peers()] if self.p2p else []
        now = now_s()
        for run, manifest in self.manifests.items():
            if self.store.run_dir(run) is None:
                continue  # we can only replay runs whose files we hold
            cov = self.coverage(run)
            by_step: dict[int, list[Claim]] = {}
            for c in self.store.claims(run, live_at=now):
                by_step.setdefault(c.step, []).append(c)
            for cand in planner.candidates(
                cov, me=self.identity.public_key, peers=[p for p in peers if p],
                attested_by_me=self.store.attested_steps(run, self.identity.public_key) | self._failed.get(run, set()),
                claims_by_step=by_step, now=now,
            ):
                out.append((manifest, cov, cand))
        return sorted(out, key=lambda item: item[2].order())

    @staticmethod
    def _peer_key(peer_id: str) -> bytes | None:
        try:
            return public_key_from_peer_id(peer_id)
        except Open1bError:
            return None

    async def _audit_loop(self) -> None:
        await self.bootstrapped.wait()
        while True:
            picked = None
            for manifest, cov, cand in self._next_candidates()[:4]:
                if await self._try_claim(manifest, cov, cand.step):
                    picked = (manifest, cand.step)
                    break
            if picked is None:
                await trio.sleep(self.config.idle_poll_s)
                continue
            await self._replay_and_attest(*picked)

    async def _replay_and_attest(self, manifest: RunManifest, step: int) -> None:
        run_dir = self.store.run_dir(manifest.run_id)
        assert run_dir is not None and self.p2p is not None
        self.counters.busy_step = step
        try:
            result = await self.worker.replay(run_dir, step, timeout_s=self.config.replay_timeout_s)
        except ReplayFailed as exc:
            self.counters.replay_failures += 1
            self._failed.setdefault(manifest.run_id, set()).add(step)
            log.warning("replay of step %d failed: %s", step, exc)
            return
        finally:
            self.counters.busy_step = None
        self.counters.replays += 1
        self.counters.replayed.append((manifest.run_id.hex(), step))
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
        log.info("step %d of run %s: %s (%d ms)", step, manifest.run_id.hex()[:12], att.verdict, result.elapsed_ms)
        await self.p2p.publish(attestations_topic(manifest.run_id), att.encoded)

    # -- sync ------------------------------------------------------------------------------
    async def _serve_sync(self, stream: Stream) -> None:
        request = decode(await stream.receive(MAX_SYNC_REQUEST), max_size=MAX_SYNC_REQUEST)
        if type(request) is not dict or set(request) != {"run"} or type(request["run"]) is not bytes:
            raise NetworkError("malformed sync request")
        run = request["run"]
        if run in self.manifests:
            for att in self.store.attestations(run)[:MAX_SYNC_STATEMENTS]:
                await stream.send(att.encoded)
        await stream.send(b"")
        await stream.close()

    async def sync_with(self, peer_id: str, run: bytes) -> int:
        """Pull ``peer_id``'s attestations of ``run``; returns how many were new here."""
        assert self.p2p is not None
        stream = await self.p2p.open_stream(peer_id, SYNC_PROTOCOL)
        new = 0
        try:
            await stream.send(encode({"run": run}))
            for _ in range(MAX_SYNC_STATEMENTS):
                frame = await stream.receive(MAX_ATTESTATION_SIZE)
                if not frame:
                    break
                new += self.ingest_attestation(frame)
        finally:
            await stream.close()
        self.counters.synced += new
        return new

    async def _sync_loop(self) -> None:
        assert self.p2p is not None
        for rounds in itertools.count(1):
            await trio.sleep(self.config.sync_interval_s)
            if rounds % DISCOVERY_EVERY_SYNC_ROUNDS == 0:
                await self.p2p.discover(MAX_DIALLED_PEERS)
            peers = self.p2p.connected_peers()
            if not peers:
                continue
            peer = random.choice(peers)
            for run in list(self.manifests):
                try:
                    with trio.fail_after(10):
                        await self.sync_with(peer, run)
                except Exception as exc:  # libp2p raises many types for a peer's failure; never ours to die of
                    log.debug("sync with %s failed: %s", peer, exc)

    # -- bootstrap -------------------------------------------------------------------------
    async def _bootstrap(self) -> None:
        """Dial the bootstrap peers (retrying with backoff until one answers), discover more
        peers through the DHT, and pull what they already know — before auditing anything, so
        a node that starts late does not redo finished work or miss live claims."""
        assert self.p2p is not None
        pending = list(self.config.bootstrap)
        delay = 0.2
        while pending and len(pending) == len(self.config.bootstrap):
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
            for run in list(self.manifests):
                try:
                    with trio.fail_after(10):
                        await self.sync_with(peer, run)
                except Exception as exc:  # libp2p raises many types for a peer's failure
                    log.debug("initial sync with %s failed: %s", peer, exc)
        self.bootstrapped.set()

    # -- API -------------------------------------------------------------------------------
    def _run_arg(self, text: str) -> bytes:
        matches = [r for r in self.manifests if r.hex().startswith(text.lower())] if text else []
        if len(matches) != 1:
            raise ApiError(404, f"no single known run matches {text!r}")
        return matches[0]

    def status(self) -> dict:
        assert self.p2p is not None
        c = self.counters
        return {
            "peer_id": self.p2p.peer_id, "addrs": self.p2p.addrs, "peers": self.p2p.connected_peers(),
            "runs": [r.hex() for r in self.manifests], "audit": self.config.audit,
            "attestations_stored": self.store.attestation_count(), "replays": c.replays,
            "replay_failures": c.replay_failures, "claims_won": c.claims_won, "claims_lost": c.claims_lost,
            "gossip_rejected": c.gossip_rejected, "gossip_ignored": c.gossip_ignored, "synced": c.synced,
            "replaying_step": c.busy_step, "replayed": c.replayed,
        }

    def routes(self) -> list[Route]:
        async def status(path, query):
            return self.status()

        async def runs(path, query):
            return [{"run": m.run_id.hex(), "steps": m.steps, "engine": m.engine, "publisher": m.signer_peer_id,
                     "replayable": self.store.run_dir(m.run_id) is not None} for m in self.manifests.values()]

        async def cov(path, query):
            run = self._run_arg(path[0] if path else "")
            try:
                redundancy = int(query.get("redundancy", self.config.redundancy))
                return coverage_json(self.coverage(run, redundancy), self.manifests[run])
            except ValueError as exc:
                raise ApiError(400, str(exc)) from exc

        async def attestations(path, query):
            run = self._run_arg(path[0] if path else "")
            step = int(query["step"]) if "step" in query and query["step"].isdigit() else None
            return [attestation_json(a) for a in self.store.attestations(run, step)]

        async def shutdown(path, query):
            self.shutdown.set()
            return {"shutting_down": True}

        return [Route("GET", "/v1/status", status), Route("GET", "/v1/runs", runs),
                Route("GET", "/v1/coverage", cov), Route("GET", "/v1/attestations", attestations),
                Route("POST", "/v1/shutdown", shutdown)]

    # -- main ------------------------------------------------------------------------------
    async def run(self) -> None:
        cfg = self.config
        async with open_p2p(self.identity, cfg.listen_host, cfg.listen_port, heartbeat_s=cfg.heartbeat_s) as p2p:
            self.p2p = p2p
            p2p.register_record_validator(CLAIM_NAMESPACE, ClaimRecords())
            p2p.set_stream_handler(SYNC_PROTOCOL, self._serve_sync)
            for run in list(self.manifests):
                await self._join_run_topics(run)
            for run_dir in cfg.run_dirs:
                await self.add_run(read_manifest(run_dir), run_dir.resolve())
            async with trio.open_nursery() as nursery:
                api_port = await nursery.start(serve_api, cfg.api_host, cfg.api_port, self.routes())
                _write_addr(cfg.data_dir / API_ADDR_FILE, f"{cfg.api_host}:{api_port}")
                _write_addr(cfg.data_dir / P2P_ADDR_FILE, p2p.addrs[0])
                log.info("node %s listening on %s, API on %s:%d", p2p.peer_id, p2p.addrs[0], cfg.api_host, api_port)
                nursery.start_soon(self._bootstrap)
                nursery.start_soon(self._sync_loop)
                if cfg.audit:
                    nursery.start_soon(self._audit_loop)
                await self.shutdown.wait()
                log.info("shutting down")
                nursery.cancel_scope.cancel()
            await self.worker.aclose()
        self.store.close()


def _write_addr(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text + "\n")
    tmp.replace(path)


def attestation_json(att: Attestation) -> dict:
    return {"digest": att.digest.hex(), "run": att.run.hex(), "step": att.step, "verdict": att.verdict,
            "pre_state": att.pre_state.hex(), "post_state": att.post_state.hex(), "signer": att.signer_peer_id,
            "engine": f"{att.engine} {att.engine_version}", "hardware": att.hardware,
            "elapsed_ms": att.elapsed_ms, "issued_at": att.issued_at,
            "encoded": att.encoded.hex()}  # the signed statement itself: anyone can re-check it


def coverage_json(cov: Coverage, manifest: RunManifest) -> dict:
    return {
        "run": cov.run.hex(), "steps": manifest.steps, "redundancy": cov.redundancy,
        "verified_steps": cov.count(StepStatus.VERIFIED), "disputed_steps": cov.disputed_steps,
        "claimed_steps": cov.count(StepStatus.CLAIMED), "unaudited_steps": cov.count(StepStatus.UNAUDITED),
        "complete": cov.complete,
        "per_step": [{"step": s.step, "status": s.status.value, "auditors": list(s.auditors),
                      "dissenters": list(s.dissenters), "claimants": list(s.claimants)} for s in cov.steps],
    }
