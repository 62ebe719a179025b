"""The node's spot check of one step (node/spot_checker.py), with a real replay worker and real
libp2p hosts on loopback: the micro-batch is judged while the trainer's answer is awaited, so a
forger that never answers is convicted by ``loss`` without waiting out the answer deadline; an
honest step whose publisher stays silent is ``no_answer`` at the deadline; one it answers passes."""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest
import trio

from open1b.deterministic.spot_run import ANSWER, MICRO
from open1b.devnet.forged_run import publish_forged_run
from open1b.node.clock import Clock
from open1b.node.config import NodeConfig
from open1b.node.metrics import NodeStats
from open1b.node.p2p import open_p2p
from open1b.node.spot_answers import SPOTCHECK_PROTOCOL, AnswerServer
from open1b.node.spot_checker import SpotChecker
from open1b.node.worker import SPOT_ANSWER, SPOT_MICRO, ReplayWorker

from .conftest import ident

pytestmark = pytest.mark.integration

STEPS, FORGED = 4, 2


@pytest.fixture(scope="module")
def forged_data_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("forged-data")
    return run_dir, publish_forged_run(run_dir, ident(0), steps=STEPS, seed=6, forgeries={FORGED: "forged-data"})


def test_the_daemon_names_the_halves_of_a_spot_check_as_the_engine_does():
    assert (SPOT_MICRO, SPOT_ANSWER) == (MICRO, ANSWER)


def test_a_micro_batch_verdict_does_not_wait_for_the_answer(forged_data_run, tmp_path):
    run_dir, manifest = forged_data_run

    async def silent(stream):  # the publisher accepts the challenge and never answers
        await stream.receive(256)
        await trio.sleep_forever()

    async def main():
        worker = ReplayWorker()
        try:
            async with AsyncExitStack() as stack:
                publisher, verifier = [await stack.enter_async_context(open_p2p(ident(70 + i), "127.0.0.1", 0))
                                       for i in range(2)]
                await verifier.connect(publisher.addrs[0])

                def checker(answer_s: float) -> SpotChecker:
                    config = NodeConfig(data_dir=tmp_path, answer_s=answer_s, replay_timeout_s=300)
                    return SpotChecker(verifier.identity, config, verifier, worker, None, runs={}, store=None, judge=None,
                                       outbox=None, clock=Clock(), stats=NodeStats(), scratch=tmp_path / "spot")

                publisher.set_stream_handler(SPOTCHECK_PROTOCOL, silent)
                # The spec's hour to answer: the forged step is convicted by its micro-batch anyway.
                with trio.fail_after(240):
                    outcome = await checker(3600.0)._challenge_and_check(manifest, FORGED, run_dir)
                assert (outcome.passed, outcome.caught) == (False, "loss")
                # An honest step of the same silent publisher: the micro-batch holds, no answer comes.
                started = trio.current_time()
                outcome = await checker(3.0)._challenge_and_check(manifest, FORGED - 1, run_dir)
                assert (outcome.passed, outcome.caught) == (False, "no_answer")
                assert trio.current_time() - started >= 3.0
                # The same step answered by the publisher's own worker: it passes.
                server = AnswerServer(worker, {manifest.run_id: manifest}, lambda r: run_dir, tmp_path / "answers",
                                      timeout_s=120, stats=NodeStats())
                publisher.set_stream_handler(SPOTCHECK_PROTOCOL, server.serve)
                with trio.fail_after(240):
                    outcome = await checker(120.0)._challenge_and_check(manifest, FORGED - 1, run_dir)
                assert (outcome.passed, outcome.caught) == (True, "none") and outcome.elapsed_ms > 0
        finally:
            await worker.aclose()

    trio.run(main)


def test_only_the_publishers_answer_convicts_at_the_micro_batch_links(tmp_path):
    """The micro-batch chunks of an answer open no commitment (docs/protocol.md §5.5, "Who
    answers"): the forger's answer of a forged micro-batch, sent by another peer, is that peer's
    failure and the verifier asks on (here: no_answer at the deadline); sent by the run's
    publisher, it convicts the step at ``gradient``."""
    from open1b.deterministic.trainer import config_of
    from open1b.devnet.forged_run import forged_answer, forged_slot
    from open1b.protocol import decode, derive_slot, encode, slot_signature

    publisher_key = ident(80)
    run_dir = tmp_path / "run"
    manifest = publish_forged_run(run_dir, publisher_key, steps=STEPS, seed=6, forgeries={FORGED: "forged-microbatch"})
    _, topology = config_of(manifest)
    slots = topology.ranks * topology.micro_batches
    # a verifier whose secret slot of the forged step is the forged one (a real forger cannot aim)
    verifier_key = next(k for k in (ident(n) for n in range(81, 200))
                        if derive_slot(slot_signature(k, manifest.run_id, FORGED), slots) == forged_slot(FORGED, slots))

    async def forger(stream):  # answers as the forger would, consistently with its commitments
        request = decode(await stream.receive(256), max_size=256)
        answer = await trio.to_thread.run_sync(forged_answer, run_dir, request["step"], request["challenge"])
        await stream.send(encode({"answer": answer}))
        await stream.close()

    async def main():
        worker = ReplayWorker()
        try:
            async with AsyncExitStack() as stack:
                publisher, other, verifier = [await stack.enter_async_context(open_p2p(key, "127.0.0.1", 0))
                                              for key in (publisher_key, ident(79), verifier_key)]
                await verifier.connect(publisher.addrs[0])
                await verifier.connect(other.addrs[0])
                config = NodeConfig(data_dir=tmp_path, answer_s=8.0, replay_timeout_s=300)
                checker = SpotChecker(verifier.identity, config, verifier, worker, None, runs={}, store=None, judge=None,
                                      outbox=None, clock=Clock(), stats=NodeStats(), scratch=tmp_path / "spot")
                other.set_stream_handler(SPOTCHECK_PROTOCOL, forger)  # the publisher does not answer yet
                with trio.fail_after(240):
                    outcome = await checker._challenge_and_check(manifest, FORGED, run_dir)
                assert (outcome.passed, outcome.caught) == (False, "no_answer")
                publisher.set_stream_handler(SPOTCHECK_PROTOCOL, forger)
                with trio.fail_after(240):
                    outcome = await checker._challenge_and_check(manifest, FORGED, run_dir)
                assert (outcome.passed, outcome.caught, outcome.slot) == (False, "gradient", forged_slot(FORGED, slots))
        finally:
            await worker.aclose()

    trio.run(main)


def test_two_lanes_never_check_the_same_step_at_once(forged_data_run, tmp_path):
    """Each lane takes a step no other lane holds, fetches into its own working directory, and
    gives the step back when its fetch fails (so a later pass may take it again)."""
    from open1b.node.runs import RunFilesError

    from .fakes import make_ledger

    _, manifest = forged_data_run
    ledger = make_ledger(tmp_path / "node", manifest)
    fetched: list[tuple[int, int]] = []
    both = trio.Event()

    async def fetch(m, step, lane):
        fetched.append((step, lane))
        if len(fetched) == 2:
            both.set()
        await both.wait()  # both lanes hold their step at once
        raise RunFilesError("no provider (the test's)")

    checker = SpotChecker(ident(80), NodeConfig(data_dir=tmp_path, spot_checks_in_flight=2), None, None, fetch,
                          runs=ledger.manifests, store=ledger.store, judge=ledger.judge, outbox=ledger.outbox,
                          clock=Clock(), stats=NodeStats(), scratch=tmp_path / "spot")

    async def main():
        async with trio.open_nursery() as nursery:
            for lane in (0, 1):
                nursery.start_soon(checker.check_once, lane)

    trio.run(main)
    (step_a, lane_a), (step_b, lane_b) = fetched
    assert step_a != step_b and {lane_a, lane_b} == {0, 1}
    assert checker._in_flight[manifest.run_id] == set()


def test_lanes_past_the_first_take_only_steps_no_one_has_checked(forged_data_run, tmp_path):
    """Once every step open to spot checks has a counted check, the second lane stands idle and the
    first alone checks steps again: repeated checks never take two lanes of the worker from replays."""
    from open1b.protocol import derive_slot, slot_signature
    from open1b.protocol.spotcheck import run_slots
    from tests.vectors import fixtures
    from tests.vectors.common import ident as vector_ident

    from .fakes import make_ledger

    _, manifest = forged_data_run
    ledger = make_ledger(tmp_path / "node", manifest, trusted_peers=(vector_ident(1).peer_id,))
    checker = SpotChecker(ident(80), NodeConfig(data_dir=tmp_path, spot_checks_in_flight=2), None, None, None,
                          runs=ledger.manifests, store=ledger.store, judge=ledger.judge, outbox=ledger.outbox,
                          clock=Clock(), stats=NodeStats(), scratch=tmp_path / "spot")

    def passed(step):  # a trusted key's pass of ``step``, valid for this run
        slot = derive_slot(slot_signature(vector_ident(1), manifest.run_id, step), run_slots(manifest))
        return fixtures.spotcheck(1, manifest, step, slot=slot, engine=manifest.engine,
                                  engine_version=manifest.engine_version, issued_at=ledger.statements.clock.wall())

    for step in range(1, manifest.steps):  # every step is checked but 0
        assert ledger.statements.ingest_spotcheck(passed(step).encoded)

    async def main():
        assert checker.next_check(1) == (manifest, 0)
        assert ledger.statements.ingest_spotcheck(passed(0).encoded)
        assert checker.next_check(1) is None  # the first sweep is done: lane 1 idles
        assert checker.next_check(0) is not None  # lane 0 goes round again

    trio.run(main)


class _NoPeers:
    peer_id = ident(90).peer_id

    def connected_peers(self):
        return []

    async def find_providers(self, key, count=20):
        return []


def test_a_full_disk_fails_the_check_for_now_logs_once_and_keeps_the_lane(forged_data_run, tmp_path, small_tmpfs,
                                                                          monkeypatch, caplog):
    """The worker's ENOSPC, writing the recomputed slot, used to end the spot checker (and the daemon)
    from inside a nursery; now the step is retried later and "storage full" is logged once."""
    import open1b.node.spot_checker as spot_checker

    from .fakes import make_ledger

    run_dir, manifest = forged_data_run
    ledger = make_ledger(tmp_path / "node", manifest)
    scratch = small_tmpfs / "spot"
    scratch.mkdir()
    try:
        (small_tmpfs / "filler").write_bytes(b"\0" * (40 << 20))
    except OSError:
        pass  # the filler takes what is left
    monkeypatch.setattr(spot_checker, "SPOT_RETRY_S", 0.0)
    released = []

    async def fetch(m, step, lane):
        return run_dir, lambda: released.append(step)

    async def main():
        worker = ReplayWorker()
        try:
            config = NodeConfig(data_dir=tmp_path, answer_s=2.0, replay_timeout_s=300)
            checker = SpotChecker(ident(90), config, _NoPeers(), worker, fetch, runs=ledger.manifests,
                                  store=ledger.store, judge=ledger.judge, outbox=ledger.outbox, clock=Clock(),
                                  stats=NodeStats(), scratch=scratch)
            with trio.fail_after(240):
                assert await checker.check_once(0)
                (step,) = released
                assert checker._skip[manifest.run_id][step] < float("inf")  # retried, not written off
                assert await checker.check_once(0)
            assert released == [step, step] and checker.stats.spot_failures == 0
            assert ledger.store.spotchecks(manifest.run_id) == []  # no verdict
        finally:
            await worker.aclose()

    with caplog.at_level("INFO", logger="open1b.node.spot_checker"):
        trio.run(main)
    assert sum("storage full" in r.getMessage() for r in caplog.records) == 1
