"""The auditor (plan → claim → replay → attest, its files from the fetcher) on trio's MockClock: replays are scripted
to take simulated minutes, fetches fail or succeed on cue, and every wait is virtual (but for the last tests, of the
real worker's replayer)."""

from __future__ import annotations

import random
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import pytest
import trio
from trio.testing import MockClock

from open1b.node.auditor import FETCH_RETRY_S, READY_WAIT_S, Auditor, WorkerReplayer
from open1b.node.claim_records import ClaimAgent
from open1b.node.clock import Clock
from open1b.node.fetcher import Fetcher
from open1b.node.p2p import NetworkError
from open1b.node.runs import RunFilesError
from open1b.node.topics import attestations_topic
from open1b.node.worker import ReplayFailed, ReplayWorker, WorkerResult
from open1b.protocol import MATCH, MISMATCH, Attestation, Claim, claim_key
from open1b.protocol.hashing import blake2b256
from tests.runs import witness_of

from .conftest import ident
from .fakes import FakeClaimBoard, FakeP2P, auditable_manifest, make_ledger

T0 = 1_800_000_000  # wall time at trio time 0
REPLAY_S = 600.0  # what one scripted replay takes, in virtual seconds
DEVICE = "cuda/sm_90"  # the device the scripted replayer says it ran on


class ScriptedReplayer:
    """Takes REPLAY_S per step and reproduces the published post-state, except for ``wrong`` steps."""

    def __init__(self, wrong: frozenset[int] = frozenset(), fail: frozenset[int] = frozenset()) -> None:
        self.wrong, self.fail, self.replayed = wrong, fail, []

    async def replay(self, manifest, run_dir, step):
        await trio.sleep(REPLAY_S)
        self.replayed.append(step)
        if step in self.fail:
            raise ReplayFailed(f"step {step}: scripted failure")
        post = blake2b256(b"wrong", bytes([step])) if step in self.wrong else manifest.state_hashes[step + 1]
        return WorkerResult(manifest.state_hashes[step], post, witness_of(step), int(REPLAY_S * 1000), DEVICE)

    def device_class(self) -> str:
        return DEVICE

    async def ready(self) -> None:
        """Ready at once: nothing to start."""


class FakeRunFiles:
    """Blobs that are available (or not, until ``available`` is set) without any bytes."""

    def __init__(self, available: bool = True) -> None:
        self.available, self.fetched, self.released = available, [], []

    async def fetch(self, p2p, blob, on_bad_peer, provide=None, bulk=None):
        await trio.sleep(1)
        if not self.available:
            raise RunFilesError(f"{blob.name}: no provider answered")
        self.fetched.append(blob.name)
        if provide is not None:
            provide(f"/open1b/blob/{blob.digest.hex()}")
        return Path("/nonexistent")

    def assemble(self, manifest, blobs, purpose=""):
        return Path("/nonexistent")

    def release(self, manifest, blobs, purpose=""):
        self.released.extend(b.name for b in blobs)


@pytest.fixture(scope="module")
def run():
    return auditable_manifest(ident(0), steps=3, created_at=T0 - 100)


def build(tmp_path, manifest, *, replayer=None, runfiles=None, board=None, me=1, **config):
    clock = Clock(wall_at_zero=T0)
    p2p = FakeP2P()
    ledger = make_ledger(tmp_path / f"node-{me}", manifest, identity=ident(me), clock=clock, gossip=p2p,
                         redundancy=1, idle_poll_s=5.0, **config)
    claims = ClaimAgent(ident(me), board or FakeClaimBoard(), lease_s=ledger.config.lease_s, clock=clock.wall,
                        sleep=clock.sleep, seen=ledger.statements.add_claim, rng=random.Random(me))
    bootstrapped = trio.Event()
    bootstrapped.set()
    fetcher = Fetcher(ident(me), runfiles or FakeRunFiles(), p2p)
    auditor = Auditor(ident(me), ledger.config, claims, fetcher, replayer or ScriptedReplayer(), runs=ledger.manifests,
                      planner=ledger.planner, judge=ledger.judge, proof=ledger.proof, outbox=ledger.outbox,
                      bootstrapped=bootstrapped, clock=clock, stats=ledger.statements.stats)
    return auditor, ledger, p2p


def own(ledger, manifest) -> list[Attestation]:
    return [a for a in ledger.store.attestations(manifest.run_id) if a.signer == ledger.identity.public_key]


@asynccontextmanager
async def serving(auditor):
    """``auditor`` serving, and its fetcher (which announces fetched blobs from its own nursery);
    with ``audit=False`` the test drives each round itself through ``audit_once``."""
    async with trio.open_nursery() as nursery:
        await nursery.start(auditor.fetcher.serve_fetcher)
        await nursery.start(auditor.serve_auditor)
        yield
        nursery.cancel_scope.cancel()


async def until(condition, *, within_s: float) -> None:
    """Wait in virtual time (bounded) for ``condition``."""
    with trio.fail_after(within_s):
        while not condition():
            await trio.sleep(1)


def test_every_step_is_claimed_replayed_attested_and_gossiped(tmp_path, run):
    auditor, ledger, p2p = build(tmp_path, run, replayer=ScriptedReplayer(wrong=frozenset({1})))

    async def main():
        async with serving(auditor):
            await until(lambda: len(own(ledger, run)) == run.steps, within_s=4 * 3600)
        return trio.current_time()

    elapsed = trio.run(main, clock=MockClock(autojump_threshold=0))
    atts = sorted(own(ledger, run), key=lambda a: a.step)
    assert [a.verdict for a in atts] == [MATCH, MISMATCH, MATCH]
    assert {a.device for a in atts} == {DEVICE} and auditor.stats.replay_device == DEVICE  # what replayed is attested
    assert all(a.issued_at >= T0 + REPLAY_S for a in atts)  # signed in (virtual) wall time
    gossiped = [Attestation.decode(d) for t, d in p2p.published if t == attestations_topic(run.run_id)]
    assert sorted(a.digest for a in gossiped) == sorted(a.digest for a in atts)
    assert run.steps * REPLAY_S <= elapsed < run.steps * (REPLAY_S + 10)  # replays one after another
    assert auditor.stats.replays == run.steps and auditor.claims.won == run.steps
    assert len(p2p.provided) == 2 * run.steps  # each fetched blob announced, off the replay's path


def test_unavailable_files_put_a_step_in_back_off_then_it_is_retried(tmp_path, run):
    files = FakeRunFiles(available=False)
    auditor, ledger, _ = build(tmp_path, run, runfiles=files, audit=False)

    async def main():
        async with serving(auditor):
            assert await auditor.audit_once()  # claimed, but nothing to replay from
            assert not own(ledger, run)
            first = {cand.step for _, cand in auditor.next_candidates()}
            assert len(first) == run.steps - 1  # the step that failed to fetch waits out its back-off
            files.available = True
            await trio.sleep(FETCH_RETRY_S)
            assert {cand.step for _, cand in auditor.next_candidates()} == set(range(run.steps))
            assert await auditor.audit_once() and own(ledger, run)

    trio.run(main, clock=MockClock(autojump_threshold=0))


def test_a_failed_replay_is_not_attested_and_not_retried(tmp_path, run):
    replayer = ScriptedReplayer(fail=frozenset(range(3)))
    auditor, ledger, _ = build(tmp_path, run, replayer=replayer, audit=False)

    async def main():
        async with serving(auditor):
            for _ in range(run.steps):
                assert await auditor.audit_once()
            assert not await auditor.audit_once()  # nothing left it may try

    trio.run(main, clock=MockClock(autojump_threshold=0))
    assert sorted(replayer.replayed) == [0, 1, 2] and not own(ledger, run)
    assert auditor.stats.replay_failures == run.steps


def test_another_nodes_live_claim_is_left_alone_until_its_lease_runs_out(tmp_path, run):
    board = FakeClaimBoard()
    auditor, ledger, _ = build(tmp_path, run, board=board)
    lease = 3600

    async def main():
        for step in range(run.steps):  # a peer holds every step's slot
            claim = Claim.create(ident(9), run=run.run_id, step=step, slot=0, issued_at=T0, lease_expiry=T0 + lease)
            await board.write(claim_key(run.run_id, step, 0), claim.encoded)
            ledger.statements.add_claim(claim)
        assert auditor.next_candidates() == []  # the planner sees them busy
        async with serving(auditor):
            await until(lambda: own(ledger, run), within_s=4 * 3600)
        return trio.current_time()

    elapsed = trio.run(main, clock=MockClock(autojump_threshold=0))
    assert lease <= elapsed < lease + auditor.config.idle_poll_s + REPLAY_S + 10


def test_a_claim_the_network_refuses_to_store_is_skipped_not_fatal(tmp_path, run):
    class Unreachable(FakeClaimBoard):
        async def write(self, key, value):
            raise NetworkError("no peer took the record")

    auditor, ledger, _ = build(tmp_path, run, board=Unreachable(), audit=False)

    async def main():
        async with serving(auditor):
            assert not await auditor.audit_once()  # every candidate tried, none claimed, nothing replayed

    trio.run(main, clock=MockClock(autojump_threshold=0))
    assert not own(ledger, run) and auditor.stats.replays == 0


def test_a_full_disk_is_logged_once_per_spell_not_once_per_step_tried(tmp_path, run, caplog):
    """An auditor below its reserve logged the same line for every step it tried, every second."""
    from open1b.node.runs import NoRoomForRunFiles

    class FullDisk(FakeRunFiles):
        async def fetch(self, p2p, blob, on_bad_peer, provide=None, bulk=None):
            if not self.available:
                raise NoRoomForRunFiles(f"{blob.name}: 1000 bytes needed plus a reserve of 256, but only 10 are free")
            return await super().fetch(p2p, blob, on_bad_peer, provide, bulk)

    files = FullDisk(available=False)
    auditor, ledger, _ = build(tmp_path, run, runfiles=files, audit=False)

    def said(text):
        return sum(text in r.getMessage() for r in caplog.records)

    async def main():
        async with serving(auditor):
            for _ in range(run.steps):  # every step tried, each finding the disk full
                assert await auditor.audit_once()
            assert not own(ledger, run) and said("storage full") == 1 and said("files unavailable") == 0
            files.available = True
            await trio.sleep(FETCH_RETRY_S)
            assert await auditor.audit_once() and said("room again") == 1
            files.available = False
            await trio.sleep(FETCH_RETRY_S)
            assert await auditor.audit_once()
            assert said("storage full") == 2  # a new spell is said again

    with caplog.at_level("INFO", logger="open1b.node.auditor"):
        trio.run(main, clock=MockClock(autojump_threshold=0))


def test_the_first_claim_waits_for_the_replayer_and_names_its_device_class(tmp_path, run):
    """A node is bootstrapped and knows its runs while its worker still chooses and self-checks its
    device: its first claims carried no class (docs/protocol.md §10.1: the class wait reads a replay
    in flight as its claim's class), and their leases ran while it started. It claims once the
    replayer is ready."""
    start_s = 90.0  # the worker's start: its device chosen and self-checked

    class Starting(ScriptedReplayer):
        def __init__(self) -> None:
            super().__init__()
            self.started = False

        def device_class(self):
            return DEVICE if self.started else None

        async def ready(self):
            await trio.sleep(start_s)
            self.started = True

    board = FakeClaimBoard()
    auditor, _, _ = build(tmp_path, run, replayer=Starting(), board=board)

    async def main():
        async with serving(auditor):
            await until(lambda: board.records, within_s=3600)

    trio.run(main, clock=MockClock(autojump_threshold=0))
    [first] = [Claim.decode(r) for r in board.records.values()]
    assert first.device == DEVICE and first.issued_at >= T0 + start_s


def test_a_replayer_that_is_never_ready_delays_the_first_claim_only_so_long(tmp_path, run):
    """A worker whose start hangs (or a harness's replayer that never says it is ready) must not
    stop the node auditing: after READY_WAIT_S it claims with its class unknown, as before it waited."""

    class Hanging(ScriptedReplayer):
        def device_class(self):
            return None

        async def ready(self):
            await trio.sleep_forever()

    board = FakeClaimBoard()
    auditor, _, _ = build(tmp_path, run, replayer=Hanging(), board=board)

    async def main():
        async with serving(auditor):
            await until(lambda: board.announced, within_s=3600)

    trio.run(main, clock=MockClock(autojump_threshold=0))
    first = board.announced[0]
    assert first.device is None and T0 + READY_WAIT_S <= first.issued_at < T0 + READY_WAIT_S + 60


@pytest.mark.parametrize("spec", ["cpu", "tpu"])
def test_the_worker_replayer_is_ready_once_the_daemons_start_ended_and_starts_none_itself(spec):
    """The real worker process, on the real clock: ready() returns once the start the daemon began
    has ended, its class said ("cpu") or the start failed ("tpu", a spec the worker refuses), and it
    never starts a second process (after a failed start, ready() once started another: a second
    cold start before the first claim)."""
    from open1b.deterministic.device import cpu_device_class

    async def main():
        worker = ReplayWorker(spec)
        replayer = WorkerReplayer(worker, timeout_s=120)
        try:
            assert replayer.device_class() is None
            async with trio.open_nursery() as nursery:  # the daemon's start and the auditor's wait, at once
                nursery.start_soon(partial(worker.start, timeout_s=120))
                with trio.fail_after(120):
                    await replayer.ready()
                assert replayer.device_class() == (cpu_device_class() if spec == "cpu" else None)
            assert worker.restarts == 1
        finally:
            await worker.aclose()

    trio.run(main)
