"""Two whole daemons (``open_daemon``, every component serving) in one trio run on ``MockClock``,
over an in-memory network (tests/node/fakes.py ``FakeNetwork``): one publishes a trained run, the
other learns it, plans, claims, fetches, replays (a stub in place of the worker process), attests,
and the publisher's judge counts every step verified. Prints protocol time covered ÷ wall time.

Everything else is the product's: the store, the ledger, the outbox, the fetcher (checkpoints over
the blob stream: the fake network gives no transport addresses, so the bulk path is never dialled),
the claim agent under the DHT's claim-record rule. The API and bulk servers listen on loopback
sockets (nobody calls them here), and no process is started (the test refuses any)."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
import trio
from trio.testing import MockClock

from open1b.node.clock import Clock
from open1b.node.config import NodeConfig
from open1b.node.daemon import open_daemon
from open1b.node.identity_file import load_or_create_identity
from open1b.node.judge import JUDGE_EVERY_S
from open1b.node.runs import checkpoint_relpath
from open1b.node.topics import RUNS_TOPIC, attestations_topic
from open1b.node.worker import WorkerResult
from open1b.protocol import MATCH, Claim, claim_key, peer_id_from_public_key
from open1b.protocol.coverage import StepStatus

from .conftest import ident
from .fakes import FakeNetwork

STEPS = 3
REPLAY_S = 600.0  # what one stub replay takes, in virtual seconds (a real step's order of magnitude)
LEASE_S = 120  # shorter than a replay: the claim must be renewed while it runs
DEVICE = "cpu/x86_64"
POLL_S = 0.01
WALL_LIMIT_S = 120.0  # the wall-clock guard: virtual time must not stall for real


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, object, list[bytes]]:
    """A trained run's directory, its manifest, and each step's witness W_k as the trainer computed
    it (a run directory holds only their commitments C_k)."""
    from open1b.deterministic.runfile import RunWriter
    from open1b.deterministic.trainer import publish_run  # numba: only for the tests that need it

    run_dir = tmp_path_factory.mktemp("whole") / "run"
    witnesses: list[bytes] = []
    record = RunWriter.record_written  # every trainer path ends there, whole-state or streamed

    def recording(writer, link, address, witness, fingerprint=None):
        witnesses.append(witness)
        record(writer, link, address, witness, fingerprint)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(RunWriter, "record_written", recording)
        manifest = publish_run(run_dir, ident(0), steps=STEPS, seed=3)
    return run_dir, manifest, witnesses


class StubReplayer:
    """In place of the worker process: takes REPLAY_S of virtual time per step and reproduces the
    trainer's states and witnesses; remembers each call and the checkpoint its working directory held."""

    def __init__(self, witnesses: list[bytes]) -> None:
        self.witnesses = witnesses
        self.calls: list[tuple[bytes, int, float, float, bytes]] = []  # (run, step, started, ended, checkpoint bytes)
        self.all_replayed = trio.Event()  # set as the last step's replay ends

    async def replay(self, manifest, run_dir: Path, step: int) -> WorkerResult:
        started = trio.current_time()
        checkpoint = (run_dir / checkpoint_relpath(step)).read_bytes()  # fetched from the publisher
        await trio.sleep(REPLAY_S)
        self.calls.append((manifest.run_id, step, started, trio.current_time(), checkpoint))
        if len(self.calls) == manifest.steps:
            self.all_replayed.set()
        return WorkerResult(manifest.state_hashes[step], manifest.state_hashes[step + 1], self.witnesses[step],
                            int(REPLAY_S * 1000), DEVICE)

    def device_class(self) -> str:
        return DEVICE

    async def ready(self) -> None:
        """Ready at once: nothing to start."""


def config(data_dir: Path, **fields) -> NodeConfig:
    return NodeConfig(data_dir=data_dir, listen="127.0.0.1:0", api="127.0.0.1:0", redundancy=1, lease_s=LEASE_S,
                      spot_checks=False, **fields)


def test_a_whole_node_audits_a_published_run_in_virtual_time(tmp_path, trained, monkeypatch):
    def no_process(*args, **kwargs):
        raise AssertionError(f"a whole node in virtual time started a process: {args}")

    monkeypatch.setattr(trio.lowlevel, "open_process", no_process)  # the worker's, among others
    run_dir, manifest, witnesses = trained
    run = manifest.run_id
    net = FakeNetwork()
    replayer = StubReplayer(witnesses)
    auditor_dir = tmp_path / "auditor"
    auditor_dir.mkdir()
    auditor_id = peer_id_from_public_key(load_or_create_identity(auditor_dir).public_key)
    t0 = int(time.time())  # signed times start now (the manifest was created before)
    found: dict[str, float] = {}

    async def main():
        clock = Clock(wall_at_zero=t0)
        async with open_daemon(config(auditor_dir), clock=clock, rng=random.Random(1), network=net.open_node,
                               replayer=replayer) as auditor:
            # the publisher audits nothing and counts the auditor's attestations (its listed peer)
            publisher_config = config(tmp_path / "publisher", audit=False, run_dirs=(run_dir,),
                                      bootstrap=(auditor.p2p.addrs[0],), trusted_peers=(auditor_id,))
            async with open_daemon(publisher_config, clock=clock, rng=random.Random(2),
                                   network=net.open_node) as publisher:
                with trio.fail_after(STEPS * REPLAY_S + 3600):
                    await replayer.all_replayed.wait()
                with trio.fail_after(2 * JUDGE_EVERY_S):  # the last attestation's way to the publisher's judge
                    while publisher.stats.run_steps.get(run.hex()) != {StepStatus.VERIFIED: STEPS}:
                        await trio.sleep(POLL_S)
                found["judged"] = trio.current_time()
                # when the publisher stored the last attestation, on the virtual clock (ms)
                found["stored"] = max(ms for _, ms in publisher.store.attestations_received(run)) / 1000 - t0
                found["wall"] = time.monotonic() - wall_started
                check(auditor, publisher)

    async def guarded():
        started = time.monotonic()
        async with trio.open_nursery() as nursery:
            async def wall_guard():
                while True:
                    await trio.sleep(1)
                    if time.monotonic() - started > WALL_LIMIT_S:
                        raise AssertionError(f"virtual time still running after {WALL_LIMIT_S} s of wall time")
            nursery.start_soon(wall_guard)
            await main()
            nursery.cancel_scope.cancel()

    def check(auditor, publisher):
        cov, own_cov = publisher.ledger.judge.coverage(run), auditor.ledger.judge.coverage(run)
        # publish: the manifest went out on gossip; the run's blobs were provided by the publisher
        assert any(author == publisher.p2p.peer_id and topic == RUNS_TOPIC and data == manifest.encoded
                   for author, topic, data in net.published)
        assert len(publisher.p2p.provided) >= STEPS + 2  # samples, every checkpoint, fingerprints
        # plan → claim → replay: each step once, in one claim held (renewed) through the replay
        assert sorted(step for r, step, *_ in replayer.calls) == list(range(STEPS))
        assert all(r == run for r, *_ in replayer.calls)
        for _, step, started, ended, checkpoint in replayer.calls:
            assert ended - started == pytest.approx(REPLAY_S, abs=1e-6)  # virtual seconds, as floats add
            assert checkpoint == (run_dir / checkpoint_relpath(step)).read_bytes()  # fetched over the blob stream
            record = Claim.decode(net.records[claim_key(run, step, 0)])
            assert record.claimant == auditor.identity.public_key and record.step == step
            assert record.lease_expiry - record.issued_at == LEASE_S
            # renewed during the replay (it outlasts a lease): issued after the replay began, before it ended
            assert t0 + started < record.issued_at <= t0 + ended
        # attest: signed, stored through the outbox, gossiped on the run's topic
        atts = sorted(auditor.store.attestations(run), key=lambda a: a.step)
        assert [(a.step, a.verdict, a.signer, a.device) for a in atts] == [
            (k, MATCH, auditor.identity.public_key, DEVICE) for k in range(STEPS)]
        for a in atts:
            call = next(c for c in replayer.calls if c[1] == a.step)
            assert a.issued_at == t0 + int(call[3])  # signed when its replay ended, on the virtual clock
        # the replay proof kept each W_k (its commitment is the manifest's C_k), for reveals
        assert auditor.store.replay_witnesses(run) == dict(enumerate(witnesses))
        assert auditor.ledger.proof.commitment_mismatches == 0
        gossiped = {data for author, topic, data in net.published
                    if author == auditor.p2p.peer_id and topic == attestations_topic(run)}
        assert gossiped == {a.encoded for a in atts}
        assert auditor.stats.own_statements[("attestation", "gossiped")] == STEPS
        # coverage: the publisher's judge counts every step verified by the auditor, within one round (1 s)
        assert [s.status for s in cov.steps] == [StepStatus.VERIFIED] * STEPS
        assert all(s.auditors == (auditor_id,) for s in cov.steps)
        assert [s.status for s in own_cov.steps] == [StepStatus.VERIFIED] * STEPS
        last_ended = max(ended for *_, ended, _ in replayer.calls)
        assert last_ended - 0.001 < found["stored"] <= last_ended  # gossip takes no virtual time (a store keeps ms)
        assert 0 <= found["judged"] - found["stored"] <= JUDGE_EVERY_S + POLL_S  # the judge's round, plus this poll
        assert not publisher.p2p.rejected and not auditor.p2p.rejected  # nobody was penalised

    wall_started = time.monotonic()
    trio.run(guarded, clock=MockClock(autojump_threshold=0))
    print(f"\nwhole node: {found['judged']:.1f} s of protocol time in {found['wall']:.2f} s of wall time: "
          f"{found['judged'] / found['wall']:.0f}x (first replay began at {min(c[2] for c in replayer.calls):.1f} s)")
