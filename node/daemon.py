"""The open1b-node daemon: learn runs, claim steps, replay them, attest, and answer queries.

Tasks (one trio nursery, all cancelled together on shutdown):

* gossip: per run, an attestations, a claims and a (witness) reveals topic, each behind a validator from
  :mod:`open1b.protocol.validation` — nothing reaches the store unvalidated; one network-wide
  runs topic carries signed manifests (docs/run-format.md §6);
* run files (:mod:`.runs`, :mod:`.blobs`): ``publish`` imports a run directory into the blob
  cache, pinned, and provides every blob in the DHT; an auditor fetches checkpoint k and the
  samples file from providers, verified against the manifest, before it replays step k;
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

from open1b.deterministic.device import cpu_device_class
from open1b.deterministic.runfile import EVALUATIONS_FILE, MANIFEST_FILE
from open1b.protocol import (
    MATCH, MISMATCH, PROTOCOL_VERSION, Attestation, Claim, Coverage, Identity, Open1bError, Outcome, RunManifest, claim_key,
    coverage, peer_id_from_public_key, public_key_from_peer_id, select_claim, validate_attestation, validate_claim,
    validate_manifest,
)
from open1b.protocol.claims import CLAIM_NAMESPACE
from open1b.protocol.codec import decode as decode_cbor
from open1b.protocol.errors import ProtocolError, UnjudgeableError
from open1b.protocol.messages import MAX_MANIFEST_SIZE
from open1b.protocol.validation import validate_reveal
from open1b.protocol.witness import WitnessReveal
from open1b.protocol.witness import witness_binding

from . import adversary
from . import claims as planner
from . import views
from .api import ApiError, RawResponse, Route, serve_api
from .blobs import BLOB_PROTOCOL, BlobCache, provider_key
from .claiming import ClaimAgent
from .config import NodeConfig, split_hostport
from .datadir import DaemonLock, check_version
from .deficits import RunIndexes
from .evaluator import Evaluator, evals_topic
from .identity_file import load_or_create_identity
from .metrics import Gauges, NodeStats, metrics_registry, render
from .p2p import MAX_PUBSUB_MESSAGE, NetworkError, P2P, RecordValidator, open_p2p
from .replay_proof import ReplayProof
from .runs import FIND_PROVIDERS_TIMEOUT_S, RunFiles, RunFilesError, checkpoint_blob, run_blobs, samples_blob, why_not_auditable
from .store import Store
from .sync import RUNS_SYNC_PROTOCOL, SYNC_PROTOCOL, pull_attestations, pull_manifests, serve_runs, serve_sync
from .systemd import notify
from .worker import ReplayFailed, ReplayWorker

log = logging.getLogger("open1b.node")

MAX_DIALLED_PEERS = 32
DISCOVERY_EVERY_SYNC_ROUNDS = 10
SYNC_TIMEOUT_S = 10.0
API_ADDR_FILE = "api.addr"
P2P_ADDR_FILE = "p2p.addr"
STORE_FILE = "store.sqlite"
BLOBS_DIR = "blobs"
RUNS_TOPIC = f"/open1b/{PROTOCOL_VERSION}/runs"
MAX_GOSSIP_MANIFEST = MAX_PUBSUB_MESSAGE - 4096  # room for the pubsub envelope; larger ones travel by sync
MAX_KNOWN_RUNS = 256  # manifests from the network beyond this are ignored (published ones still count)
FETCH_RETRY_S = 10.0  # a step whose files could not be fetched is retried after this long
REPROVIDE_S = 12 * 3600.0  # provider records expire after 48 h (py-libp2p): announce again well before


def now_s() -> int:
    return int(time.time())


def attestations_topic(run: bytes) -> str:
    return f"/open1b/{PROTOCOL_VERSION}/run/{run.hex()}/attestations"


def reveals_topic(run: bytes) -> str:
    return f"/open1b/{PROTOCOL_VERSION}/run/{run.hex()}/reveals"


def claims_topic(run: bytes) -> str:
    return f"/open1b/{PROTOCOL_VERSION}/run/{run.hex()}/claims"


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
        self.runfiles: RunFiles | None = None
        self.runs_synced = 0  # manifests learned through the runs sync protocol
        self.publications: dict[str, dict] = {}  # run hex -> progress of a publish (API /v1/publications)
        self._fetch_backoff: dict[tuple[bytes, int], float] = {}  # (run, step) -> retry after (monotonic)
        self._nursery: trio.Nursery | None = None
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
        self.proof: ReplayProof | None = None  # our replays' witnesses, and the reveals they call for
        self.evaluator: Evaluator | None = None  # eval statements, checks and the leaderboard (set in _serve)
        self._publishers = frozenset(public_key_from_peer_id(p) for p in config.publishers)

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
            (reveals_topic(run), self._validate_reveal, self._on_reveal),
            (evals_topic(run), self._validate_eval, self._on_eval),
        ):
            if topic in self._topics:
                continue
            self._topics.add(topic)
            self.p2p.set_validator(topic, validator)
            await self.p2p.subscribe(topic, handler)

    def _validate_manifest(self, author: str, data: bytes) -> Outcome:
        verdict = self._judge_manifest(data)
        self.stats.record_gossip("manifest", verdict.outcome.value)
        self._count_refusal("manifest", verdict)
        if verdict.outcome is not Outcome.ACCEPT:
            log.info("gossip manifest from %s: %s (%s)", author, verdict.outcome.value, verdict.reason)
        return verdict.outcome

    def _judge_manifest(self, data: bytes):
        verdict = validate_manifest(data, now_s())
        if not verdict.accepted:
            return verdict
        try:
            # [IGNORE] a manifest of this node's kind (external trajectories are not gossiped here)
            if not isinstance(verdict.message, RunManifest):
                raise UnjudgeableError("not a run manifest", code="manifest_kind")
            # A known run is always accepted below: it may be our own, or one the operator named.
            if verdict.message.run_id not in self.manifests:
                # [IGNORE] a publisher the operator did not choose (config: publishers)
                if self._publishers and verdict.message.publisher not in self._publishers:
                    raise UnjudgeableError("not a publisher this node audits", code="publisher")
                # [IGNORE] room for one more run
                if len(self.manifests) >= MAX_KNOWN_RUNS:
                    raise UnjudgeableError("too many runs known", code="runs_full")
        except UnjudgeableError as exc:
            return type(verdict)(exc.outcome, f"{type(exc).__name__}: {exc}", code=exc.code)
        return verdict

    async def ingest_manifest(self, data: bytes, source: str | None = None) -> bool:
        """Validate and store a manifest from gossip or sync; True if the run is new here."""
        verdict = self._judge_manifest(data)
        if not verdict.accepted:
            self._refused_in_sync(verdict, source)
            return False
        manifest = verdict.message
        if manifest.run_id in self.manifests:
            return False
        await self.add_run(manifest, None)
        self.runs_synced += source is not None
        why = why_not_auditable(manifest)
        log.info("learned run %s (%d steps, publisher %s)%s", manifest.run_id.hex()[:16], manifest.steps,
                 manifest.signer_peer_id, f"; not auditing it: {why}" if why else "")
        return True

    def _refused_in_sync(self, verdict, source: str | None) -> None:
        """A statement a sync response (from ``source``) carried was refused: counted, and a
        provably invalid one is held against that peer, as on gossip. (Gossip refusals are
        counted by the validators.)"""
        if source is not None and self.p2p is not None:
            self._count_refusal("sync", verdict)
            if verdict.outcome is Outcome.REJECT:
                self.p2p.penalise(source)

    async def _on_manifest(self, author: str, data: bytes) -> None:
        await self.ingest_manifest(data)

    # -- publishing ------------------------------------------------------------------------
    @staticmethod
    def read_run_manifest(run_dir: Path) -> RunManifest:
        """``run_dir``'s manifest, validated as gossip would be; :class:`ApiError` (400) if it is not one."""
        try:
            data = (run_dir / MANIFEST_FILE).read_bytes()[: MAX_MANIFEST_SIZE + 1]
        except OSError as exc:
            raise ApiError(400, f"no run at {run_dir}: {exc.strerror or exc}") from None
        verdict = validate_manifest(data, now_s())
        if not verdict.accepted or not isinstance(verdict.message, RunManifest):
            raise ApiError(400, f"{run_dir / MANIFEST_FILE}: {verdict.reason if not verdict.accepted else 'not a run manifest'}")
        return verdict.message

    def start_publish(self, run_dir: Path, manifest: RunManifest | None = None) -> dict:
        """Validate ``run_dir``'s manifest now; check, import, provide and announce its files in the
        background (progress: :attr:`publications`). Raises :class:`ApiError` for a bad manifest."""
        assert self._nursery is not None
        run_dir = Path(run_dir).resolve()
        manifest = manifest or self.read_run_manifest(run_dir)
        run = manifest.run_id.hex()
        job = self.publications.get(run)
        if job is not None and job["state"] not in ("done", "failed"):
            return job
        job = {"run": run, "dir": str(run_dir), "steps": manifest.steps, "state": "checking", "done": 0,
               "total": manifest.steps + 2, "note": "", "bytes": 0, "provided": 0, "gossiped": False,
               "error": None, "started_at": time.time(), "seconds": None}
        self.publications[run] = job
        self._nursery.start_soon(self._publish, manifest, run_dir, job)
        return job

    async def _publish(self, manifest: RunManifest, run_dir: Path, job: dict) -> None:
        assert self.runfiles is not None and self.p2p is not None
        started = time.monotonic()

        def progress(done: int, total: int, note: str) -> None:
            job.update(done=done, total=total, note=note)

        try:
            log.info("publishing run %s from %s: checking %d files", job["run"][:16], run_dir, manifest.steps + 2)
            job["bytes"] = await self.runfiles.import_dir(manifest, run_dir, progress)
            await self.add_run(manifest, run_dir)
            job.update(state="providing", done=0)
            await self.bootstrapped.wait()
            blobs = run_blobs(manifest)
            for i, blob in enumerate(blobs):
                job.update(done=i, total=len(blobs), note=f"providing {blob.name}")
                job["provided"] += bool(await self.p2p.provide(provider_key(blob.digest)))
            job.update(state="announcing", done=len(blobs), note="gossiping the manifest")
            job["gossiped"] = await self._announce(manifest)
            if self.evaluator is not None and (run_dir / EVALUATIONS_FILE).exists():
                await self.evaluator.publish_results(manifest, run_dir)  # only a run this node's key signed
            job.update(state="done", note="", seconds=round(time.monotonic() - started, 3))
            log.info("published run %s: %d blobs provided, manifest %s", job["run"][:16], job["provided"],
                     "gossiped" if job["gossiped"] else "left to sync (too large for gossip)")
        except (Open1bError, OSError) as exc:
            job.update(state="failed", error=str(exc), seconds=round(time.monotonic() - started, 3))
            log.warning("publishing %s failed: %s", run_dir, exc)

    async def _announce(self, manifest: RunManifest) -> bool:
        assert self.p2p is not None
        if len(manifest.encoded) > MAX_GOSSIP_MANIFEST:
            return False
        await self.p2p.publish(RUNS_TOPIC, manifest.encoded)
        return True

    async def _run_files(self, manifest: RunManifest, step: int) -> tuple[Path, list]:
        """Fetch (or find in the cache) what replaying ``step`` needs and assemble the working directory."""
        assert self.runfiles is not None and self.p2p is not None
        blobs = [samples_blob(manifest), checkpoint_blob(manifest, step)]
        for blob in blobs:
            await self.runfiles.fetch(self.p2p, blob, on_bad_peer=self.p2p.penalise, provide=self._provide_soon)
        return self.runfiles.assemble(manifest, blobs), blobs

    def _provide_soon(self, key: str) -> None:
        """Announce a blob we now hold without holding up the replay that fetched it (a DHT
        provide can take seconds, and up to its timeout when peers are unreachable)."""
        assert self._nursery is not None and self.p2p is not None
        p2p = self.p2p

        async def provide() -> None:
            with trio.move_on_after(FIND_PROVIDERS_TIMEOUT_S):
                await p2p.provide(key)

        self._nursery.start_soon(provide)

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
            self._refused_in_sync(verdict, source)
            return False
        added = self.store.add_attestation(verdict.message)
        if added:
            self.stats.attestations_received += 1
            self._stored(verdict.message)
        return added

    def _stored(self, att: Attestation) -> None:
        if self.proof is not None:
            self.proof.check(att)
        self._trust_stale.add(att.run)
        if self._plans_with(att):
            self.deficits.add_attestation(att)

    def _plans_with(self, att: Attestation) -> bool:
        """Whether the planner counts ``att``: our own always (we never attest a step twice);
        others' when the trust policy counts the key, coverage has not flagged it and no held witness
        reveal disproves it (docs/protocol.md §8.2)."""
        me = att.signer == self.identity.public_key
        return me or (self.trust.trusts(att.signer) and att.signer not in self.flagged.get(att.run, ())
                      and not (self.proof is not None and self.proof.disproves(att)))

    # -- certified evaluation (docs/run-format.md §9): node/evaluator.py does the work -----------
    def _validate_eval(self, author: str, data: bytes) -> Outcome:
        assert self.evaluator is not None
        verdict = self.evaluator.validate(data)
        self.stats.record_gossip("eval", verdict.outcome.value)
        self._count_refusal("eval", verdict)
        return verdict.outcome

    async def _on_eval(self, author: str, data: bytes) -> None:
        assert self.evaluator is not None
        self.evaluator.ingest(data)

    async def _eval_checkpoint(self, manifest: RunManifest, state: int) -> Path | None:
        """A run directory holding checkpoint ``state`` (fetched like a replay's), or None for now."""
        try:
            run_dir, _ = await self._run_files(manifest, state)
        except (Open1bError, OSError) as exc:
            log.info("evaluation of state %d of %s waits: %s", state, manifest.run_id.hex()[:16], exc)
            return None
        return run_dir

    # -- proof of replay: witness reveals (docs/run-format.md §5) ----------------------------
    def _validate_reveal(self, author: str, data: bytes) -> Outcome:
        verdict = validate_reveal(data, self.manifest, now_s())
        self.stats.record_gossip("reveal", verdict.outcome.value)
        self._count_refusal("reveal", verdict)
        return verdict.outcome

    def ingest_reveal(self, data: bytes, source: str | None = None) -> bool:
        """Validate and store one witness reveal; True if it was new (as :meth:`ingest_attestation`)."""
        assert self.store is not None
        verdict = validate_reveal(data, self.manifest, now_s())
        if not verdict.accepted:
            self._refused_in_sync(verdict, source)
            return False
        added = self.store.add_reveal(verdict.message)
        if added:
            self._revealed(verdict.message)
        return added

    def _revealed(self, reveal: WitnessReveal) -> None:
        """A new reveal: coverage may flag a copier now, and the planner stops counting the matches
        it disproves (so the steps they alone covered are replayed again)."""
        if self.proof is not None:
            self.proof.stored_reveal(reveal)
        self._trust_stale.add(reveal.run)
        self.deficits = RunIndexes(self.identity.public_key, self.config.redundancy, self._load_run, now_s)

    def ingest_synced(self, data: bytes, source: str) -> bool:
        """A sync frame: an attestation or a witness reveal, told apart by its kind."""
        try:
            value = decode_cbor(data, max_size=len(data))
            kind = value.get("kind") if type(value) is dict else None
        except Open1bError:
            kind = None
        if kind == WitnessReveal.KIND:
            return self.ingest_reveal(data, source=source)
        return self.ingest_attestation(data, source=source)

    async def _on_reveal(self, author: str, data: bytes) -> None:
        self.ingest_reveal(data)

    async def _publish_reveals(self) -> None:
        assert self.p2p is not None
        for reveal in self.proof.due(now_s()) if self.proof is not None else ():
            self._revealed(reveal)
            await self.p2p.publish(reveals_topic(reveal.run), reveal.encoded)

    def _counts(self, run: bytes, key: bytes) -> bool:
        return self.trust.trusts(key) and key not in self.flagged.get(run, ())

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
            reveals=self.store.reveals(run),
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
            await self._publish_reveals()
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
        now = time.monotonic()
        for run, manifest in self.manifests.items():
            if why_not_auditable(manifest) is not None:
                continue  # a node runs only its own engine
            index = self.deficits.index(run)
            done_here = index.mine | self._failed.get(run, set())
            done_here = done_here | {s for (r, s), t in self._fetch_backoff.items() if r == run and t > now}
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
        self.stats.busy_step = step
        started = time.monotonic()
        failure: ReplayFailed | None = None
        unavailable: RunFilesError | None = None
        blobs: list = []
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.claimer.hold, claim)  # fetching and replaying may outlast one lease
                try:
                    run_dir, blobs = await self._run_files(manifest, step)
                    result = await self._replay(manifest, run_dir, step)
                except ReplayFailed as exc:  # caught in here: a nursery would wrap it in a group
                    failure = exc
                except RunFilesError as exc:
                    unavailable = exc
                nursery.cancel_scope.cancel()
        finally:
            self.stats.busy_step = None
            if blobs and self.runfiles is not None:
                self.runfiles.release(manifest, blobs[1:])  # keep samples.bin, drop the checkpoint link
        if unavailable is not None:
            # Not a verdict and not permanent: providers may appear (or stop lying). Retry later.
            self._fetch_backoff[(manifest.run_id, step)] = time.monotonic() + FETCH_RETRY_S
            log.warning("step %d of run %s: files unavailable: %s", step, manifest.run_id.hex()[:12], unavailable)
            return
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
            device=cpu_device_class(), elapsed_ms=result.elapsed_ms, issued_at=now_s(),
            witness=witness_binding(manifest.run_id, step, self.identity.public_key, result.witness),
        )
        self.store.add_attestation(att)
        self._stored(att)
        if self.proof is not None:
            self.proof.replayed(manifest, step, result.post_state, result.witness)
        log.info("step %d of run %s: %s (%d ms)", step, manifest.run_id.hex()[:12], att.verdict, result.elapsed_ms)
        await self.p2p.publish(attestations_topic(manifest.run_id), att.encoded)

    async def _replay(self, manifest: RunManifest, run_dir: Path, step: int):
        if self.adversary is not None:  # a devnet's deliberately broken node
            return await self.adversary.replay(self, manifest, run_dir, step)
        return await self.worker.replay(run_dir, step, timeout_s=self.config.replay_timeout_s)

    # -- sync and peers --------------------------------------------------------------------
    def _attestations_for_sync(self, run: bytes) -> list[Attestation] | None:
        assert self.store is not None
        if run not in self.manifests:
            return None
        return [*self.store.attestations(run), *self.store.reveals(run)]

    async def sync_with(self, peer_id: str) -> int:
        assert self.p2p is not None
        new = 0
        try:
            with trio.fail_after(SYNC_TIMEOUT_S):
                new += await pull_manifests(self.p2p, peer_id, lambda run: run in self.manifests,
                                            lambda data: self.ingest_manifest(data, source=peer_id))
        except ProtocolError as exc:  # a malformed answer: provably the peer's fault
            log.info("runs sync with %s: %s", peer_id, exc)
            self.validation[f"sync/reject/{exc.code}"] += 1
            self.p2p.penalise(peer_id)
        except Exception as exc:  # libp2p raises many types for a peer's failure; never ours to die of
            log.debug("runs sync with %s failed: %s", peer_id, exc)
        for run in list(self.manifests):
            try:
                with trio.fail_after(SYNC_TIMEOUT_S):
                    new += await pull_attestations(self.p2p, peer_id, run,
                                                   lambda data: self.ingest_synced(data, source=peer_id))
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

    async def _reprovide_loop(self) -> None:
        """Provider records expire (48 h in py-libp2p): announce every blob we hold again, twice a day."""
        assert self.p2p is not None and self.runfiles is not None
        await self.bootstrapped.wait()
        while True:
            await trio.sleep(REPROVIDE_S)
            for path in list(self.runfiles.cache.dir.iterdir()):
                if len(path.name) == 64:
                    await self.p2p.provide(provider_key(bytes.fromhex(path.name)))

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
        blobs = {}
        if self.runfiles is not None:
            f, cache = self.runfiles.stats, self.runfiles.cache
            blobs = dict(blobs_fetched=f.fetched, blob_fetch_failures=f.failed, blob_fetched_bytes=f.fetched_bytes,
                         blob_served_bytes=cache.served_bytes, blob_bad_providers=f.bad_providers,
                         blob_cache_bytes=cache.used_bytes())
        return Gauges(self.store.attestation_count(), len(self.p2p.connected_peers()), len(self.p2p.banned),
                      len(self.manifests), **blobs)

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
            "reveals_made": self.proof.revealed if self.proof else 0,
            "witness_commitment_mismatches": self.proof.commitment_mismatches if self.proof else 0,
            "runs_synced": self.runs_synced, "blobs": self.blob_status(),
        }

    def blob_status(self) -> dict:
        if self.runfiles is None:
            return {}
        f, cache = self.runfiles.stats, self.runfiles.cache
        return {"fetched": f.fetched, "fetched_bytes": f.fetched_bytes, "fetch_failures": f.failed,
                "bad_providers": f.bad_providers, "served_bytes": cache.served_bytes,
                "cache_bytes": cache.used_bytes(), "cache_limit": cache.max_bytes, "pinned": len(cache.pinned),
                "fetching": {name: {"done": d, "total": t} for name, (d, t) in f.in_flight.items()}}

    def routes(self) -> list[Route]:
        assert self.store is not None and self.p2p is not None
        store, p2p = self.store, self.p2p

        async def status(path, query):
            return self.status()

        async def peers(path, query):
            return [{"peer_id": p, "addrs": p2p.peer_addrs(p), "rejected": p2p.rejected.get(p, 0)}
                    for p in p2p.connected_peers()]

        async def runs(path, query):
            out = []
            for m in self.manifests.values():
                item = views.run_json(m, str(store.run_dir(m.run_id) or "") or None)
                item["auditable"] = why_not_auditable(m) is None
                out.append(item)
            return out

        async def publish(path, query):
            if not query.get("dir"):
                raise ApiError(400, "publish needs ?dir=<run directory>")
            return self.start_publish(Path(query["dir"]))

        async def publications(path, query):
            if path:
                jobs = [j for run, j in self.publications.items() if run.startswith(path[0].lower())]
                if len(jobs) != 1:
                    raise ApiError(404, f"no single run matching {path[0]!r} was published by this node since it started")
                return jobs[0]
            return list(self.publications.values())

        async def fetch(path, query):
            run = self._run_arg(path[0] if path else "")
            step = query.get("step", "")
            if not step.isdigit() or int(step) >= self.manifests[run].steps:
                raise ApiError(400, "fetch needs ?step=<a step of the run>")
            try:
                work, _ = await self._run_files(self.manifests[run], int(step))
            except RunFilesError as exc:
                raise ApiError(404, str(exc)) from None
            return {"run": run.hex(), "step": int(step), "run_dir": str(work)}

        async def cov(path, query):
            run = self._run_arg(path[0] if path else "")
            try:
                redundancy = int(query.get("redundancy", self.config.redundancy))
                return {**views.coverage_json(self.coverage(run, redundancy), self.manifests[run]),
                        "evaluations": self.evaluator.status(self.manifests[run]) if self.evaluator else []}
            except ValueError as exc:
                raise ApiError(400, str(exc)) from exc

        async def attestations(path, query):
            run = self._run_arg(path[0] if path else "")
            step = query.get("step")
            if step is not None and not step.isdigit():
                raise ApiError(400, "step must be a non-negative integer")
            return [views.attestation_json(a, ms) for a, ms in store.attestations_received(run, int(step) if step else None)]

        async def reveals(path, query):
            run = self._run_arg(path[0] if path else "")
            return [views.reveal_json(r) for r in store.reveals(run)]

        async def reveal(path, query):  # a trainer publishing W_step after the audit (docs/run-format.md §5.2)
            run = self._run_arg(path[0] if path else "")
            step, witness = query.get("step", ""), query.get("witness", "")
            if not step.isdigit() or len(witness) != 64 or any(c not in "0123456789abcdef" for c in witness.lower()):
                raise ApiError(400, "reveal needs ?step=<a step>&witness=<W_step as 64 hex digits>")
            made = WitnessReveal.create(self.identity, run=run, step=int(step), witness=bytes.fromhex(witness),
                                        issued_at=now_s())
            verdict = validate_reveal(made.encoded, self.manifest, now_s())
            if not verdict.accepted:
                raise ApiError(400, f"not a valid reveal: {verdict.reason}")
            if store.add_reveal(made):
                self._revealed(made)
            await p2p.publish(reveals_topic(run), made.encoded)
            return views.reveal_json(made)

        async def claims(path, query):
            now = now_s()
            runs = [self._run_arg(path[0])] if path else list(self.manifests)
            return [views.claim_json(c, now) for run in runs for c in store.claims(run, live_at=now)]

        async def shutdown(path, query):
            self.shutdown.set()
            return {"shutting_down": True}

        return [Route("GET", "/v1/status", status), Route("GET", "/v1/peers", peers), Route("GET", "/v1/runs", runs),
                Route("GET", "/v1/coverage", cov), Route("GET", "/v1/attestations", attestations),
                Route("GET", "/v1/claims", claims), Route("POST", "/v1/shutdown", shutdown),
                Route("GET", "/v1/reveals", reveals), Route("POST", "/v1/reveal", reveal),
                Route("POST", "/v1/publish", publish), Route("GET", "/v1/publications", publications),
                Route("POST", "/v1/fetch", fetch), *(self.evaluator.routes() if self.evaluator else ())]

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
            self.proof = ReplayProof(self.identity, self.store, self._counts)
            self.runfiles = RunFiles(cfg.data_dir, BlobCache(cfg.data_dir / BLOBS_DIR, cfg.blob_cache_bytes))
            try:
                # an operator's local runs (--run): a bad manifest stops the daemon before it listens
                local_runs = tuple((Path(d).resolve(), self.read_run_manifest(Path(d).resolve())) for d in cfg.run_dirs)
                self.manifests = {m.run_id: m for m in self.store.manifests()}
                for run, m in self.manifests.items():
                    if self.store.run_dir(run) is not None and why_not_auditable(m) is None:
                        self.runfiles.pin(m)  # runs we published: served for as long as we run
                async with open_p2p(self.identity, listen_host, listen_port, heartbeat_s=cfg.heartbeat_s,
                                    max_rejects_per_peer=cfg.max_rejects_per_peer) as p2p:
                    await self._serve(p2p, local_runs)
            finally:
                await self.worker.aclose()
                self.store.close()

    async def _serve(self, p2p: P2P, local_runs: tuple[tuple[Path, RunManifest], ...] = ()) -> None:
        cfg = self.config
        self.p2p = p2p
        self.claimer = ClaimAgent(self.identity, _DhtClaimBoard(p2p), lease_s=cfg.lease_s, clock=now_s,
                                  sleep=trio.sleep, seen=self._seen_claim)
        p2p.register_record_validator(CLAIM_NAMESPACE, ClaimRecords())
        p2p.set_stream_handler(SYNC_PROTOCOL, lambda stream: serve_sync(stream, self._attestations_for_sync))
        p2p.set_stream_handler(RUNS_SYNC_PROTOCOL, lambda stream: serve_runs(
            stream, lambda: list(self.manifests), lambda run: m.encoded if (m := self.manifests.get(run)) else None))
        assert self.runfiles is not None
        p2p.set_stream_handler(BLOB_PROTOCOL, self.runfiles.cache.serve)
        self.evaluator = Evaluator(self.store, self.identity, publish=p2p.publish, checkpoint=self._eval_checkpoint,
                                   now=now_s, device=cpu_device_class(), policy=self.trust,
                                   redundancy=cfg.redundancy)
        p2p.set_validator(RUNS_TOPIC, self._validate_manifest)
        await p2p.subscribe(RUNS_TOPIC, self._on_manifest)
        for run in list(self.manifests):
            await self._join_run_topics(run)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for run_dir, manifest in local_runs:  # imported and announced like `publish` (its files are checked there)
                self.start_publish(run_dir, manifest)
            nursery.start_soon(self._reprovide_loop)
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
            await nursery.start(self.evaluator.serve, cfg.audit)  # an observer only keeps statements moving
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
