"""The challenge stream ``/open1b/spotcheck/1.0.0`` between real libp2p hosts on loopback: the
publishing node answers in its replay worker, checks the challenge is the asker's own signature,
refuses what it cannot or will not answer, and the verifier gives up at its deadline."""

from __future__ import annotations

import random
from contextlib import AsyncExitStack

import trio
import trio.testing

from open1b.node.clock import Clock
from open1b.node.config import NodeConfig
from open1b.node.daemon import open_daemon
from open1b.node.metrics import NodeStats
from open1b.node.p2p import open_p2p
from open1b.node.spot_answers import (
    MAX_PENDING_ANSWERS,
    REPEAT_INTERVAL_S,
    SPOTCHECK_PROTOCOL,
    AnswerServer,
    ask,
    request_answer,
)
from open1b.node.worker import ReplayWorker
from open1b.protocol import challenge_signature, slot_signature

from .conftest import ident


def test_publisher_answers_checked_challenges_and_refuses_the_rest(tampered_run, tmp_path):
    run_dir, manifest = tampered_run
    run = manifest.run_id

    async def main():
        worker = ReplayWorker()
        try:
            with trio.fail_after(240):
                async with AsyncExitStack() as stack:
                    a, b = [await stack.enter_async_context(open_p2p(ident(60 + i), "127.0.0.1", 0)) for i in range(2)]
                    stats = NodeStats()
                    server = AnswerServer(worker, {run: manifest}, lambda r: run_dir if r == run else None,
                                          tmp_path / "spot", timeout_s=120, stats=stats)
                    a.set_stream_handler(SPOTCHECK_PROTOCOL, server.serve)
                    await b.connect(a.addrs[0])
                    mine = challenge_signature(b.identity, run, 1)

                    answer = await ask(b, a.peer_id, run, 1, mine)
                    assert answer is not None and len(answer) > 0 and stats.challenges_answered == 1
                    # the answer is the one a spot check accepts (the worker checks it, as a verifier's would)
                    (tmp_path / "a.cbor").write_bytes(answer)
                    outcome = await worker.spot(run_dir, 1, (mine, slot_signature(b.identity, run, 1)),
                                                tmp_path / "a.cbor", tmp_path / "slot.f32", timeout_s=120)
                    assert outcome.passed

                    # another key's challenge, a step outside the run, an unknown run: refused, nothing computed
                    assert await ask(b, a.peer_id, run, 1, challenge_signature(ident(7), run, 1)) is None
                    assert await ask(b, a.peer_id, run, manifest.steps, challenge_signature(b.identity, run, 6)) is None
                    assert await ask(b, a.peer_id, bytes(32), 1, challenge_signature(b.identity, bytes(32), 1)) is None
                    assert stats.challenges_answered == 1
                    assert (await server.answer(b.peer_id, run, 1, challenge_signature(ident(7), run, 1))
                            == {"error": "bad_challenge"})
                    assert await server.answer(b.peer_id, bytes(32), 1, mine) == {"error": "unknown_run"}

                    # a node that never answers: the verifier waits its deadline and gets None
                    async def silent(stream):
                        await stream.receive(256)
                        await stream.receive(1)

                    a.set_stream_handler(SPOTCHECK_PROTOCOL, silent)
                    started = trio.current_time()
                    got = await request_answer(b, _peers(a.peer_id), run, 1, mine, deadline_s=2.0, skip=set(),
                                               sleep=trio.sleep)
                    assert got is None and trio.current_time() - started >= 2.0
                    # a peer already tried is skipped: nobody left to ask, None at the deadline
                    a.set_stream_handler(SPOTCHECK_PROTOCOL, server.serve)
                    assert await request_answer(b, _peers(a.peer_id), run, 1, mine, deadline_s=1.0,
                                                skip={a.peer_id}, sleep=trio.sleep) is None
                    got = await request_answer(b, _peers(a.peer_id), run, 1, mine, deadline_s=60, skip=set(),
                                               sleep=trio.sleep)
                    assert got is not None and got[0] == a.peer_id and got[1] == answer  # the answer is deterministic
        finally:
            await worker.aclose()

    trio.run(main)


def _peers(*ids: str):
    async def candidates() -> list[str]:
        return list(ids)
    return candidates


class _BlockedWorker:
    """Stands in for the worker so that answers stay pending until the test releases them."""

    def __init__(self) -> None:
        self.release = trio.Event()
        self.calls = 0

    async def answer(self, run_dir, step, challenge, out, *, timeout_s):
        self.calls += 1
        await self.release.wait()
        out.write_bytes(b"\xa0")
        return 1


def test_answers_beyond_the_bound_are_refused_at_once(tampered_run, tmp_path):
    run_dir, manifest = tampered_run
    run = manifest.run_id
    worker = _BlockedWorker()
    server = AnswerServer(worker, {run: manifest}, lambda r: run_dir, tmp_path / "spot", timeout_s=60, stats=NodeStats())
    replies: list[dict] = []

    async def main():
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                async def one(asker):  # each its own key: one key has one answer pending at most
                    replies.append(await server.answer(asker.peer_id, run, 1, challenge_signature(asker, run, 1)))

                for i in range(MAX_PENDING_ANSWERS):
                    nursery.start_soon(one, ident(8 + i))
                await trio.testing.wait_all_tasks_blocked()
                assert server.pending == MAX_PENDING_ANSWERS and worker.calls == 1  # one computes, the rest wait
                await one(ident(8 + MAX_PENDING_ANSWERS))
                assert replies == [{"error": "busy"}]
                worker.release.set()
        assert replies[1:] == [{"answer": b"\xa0"}] * MAX_PENDING_ANSWERS and server.pending == 0

    trio.run(main)


def test_a_publisher_answers_while_its_replay_worker_is_busy(tampered_run, tmp_path):
    """A replay of a real step can take the whole ANSWER_SECONDS: the daemon's answers must not
    queue behind it, or an honest trainer that also audits fails every challenge."""
    run_dir, manifest = tampered_run
    run = manifest.run_id

    async def main():
        config = NodeConfig(data_dir=tmp_path / "node", listen="127.0.0.1:0", api="127.0.0.1:0", audit=False)
        with trio.fail_after(240):
            async with open_daemon(config, clock=Clock(), rng=random.Random(0)) as daemon:
                await daemon.ledger.statements.add_run(manifest, run_dir)
                async with open_p2p(ident(62), "127.0.0.1", 0) as verifier:
                    await verifier.connect(daemon.p2p.addrs[0])
                    replays = daemon.auditor.replayer.worker
                    async with replays._turns.turn():  # a replay in progress, as long as it takes
                        with trio.fail_after(90):  # an answer on `tiny`: seconds, its worker's start included
                            answer = await ask(verifier, daemon.p2p.peer_id, run, 1,
                                               challenge_signature(verifier.identity, run, 1))
                    assert answer is not None and daemon.stats.challenges_answered == 1

    trio.run(main)


def test_one_key_has_one_answer_pending_half_the_worker_and_repeats_cost_nothing(tampered_run, tmp_path):
    run_dir, manifest = tampered_run
    run, spammer, honest = manifest.run_id, ident(20), ident(21)
    worker = _BlockedWorker()
    penalised: list[str] = []
    server = AnswerServer(worker, {run: manifest}, lambda r: run_dir, tmp_path / "spot", timeout_s=60,
                          stats=NodeStats(), penalise=penalised.append)
    replies: list[dict] = []

    async def ask_as(key, step):
        replies.append(await server.answer(key.peer_id, run, step, challenge_signature(key, run, step)))

    async def main():
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for _ in range(8):
                    nursery.start_soon(ask_as, spammer, 1)
                await trio.testing.wait_all_tasks_blocked()
                assert replies == [{"error": "busy"}] * 7 and worker.calls == 1  # one of its 8 computes
                nursery.start_soon(ask_as, honest, 1)  # another key is not turned away: it waits its turn
                await trio.testing.wait_all_tasks_blocked()
                assert len(replies) == 7 and server.pending == 2
                clock.jump(3.0)  # the spammer's answer takes 3 s of the worker
                worker.release.set()
            assert replies[7:] == [{"answer": b"\xa0"}] * 2 and worker.calls == 2
            # the same challenge again: the kept answer, no computation; this soon, a reject
            await ask_as(spammer, 1)
            assert replies[-1] == {"answer": b"\xa0"} and worker.calls == 2 and penalised == [spammer.peer_id]
            # another step: not before the spammer has waited as long as its last answer took
            await ask_as(spammer, 2)
            assert replies[-1] == {"error": "busy"}
            clock.jump(3.0)
            await ask_as(spammer, 2)
            assert replies[-1] == {"answer": b"\xa0"} and worker.calls == 3
            clock.jump(REPEAT_INTERVAL_S)
            await ask_as(spammer, 2)  # asked again after a while (the verifier's own failure): no reject
            assert worker.calls == 3 and penalised == [spammer.peer_id]

    clock = trio.testing.MockClock()
    trio.run(main, clock=clock)


def test_a_spamming_key_gets_one_computation_and_honest_verifiers_their_answers(tampered_run, tmp_path):
    """Real hosts and the real answer worker: one key sends 8 challenges at a time, over and over;
    the publisher computes its answer once, answers the honest verifier too, and bans the spammer."""
    run_dir, manifest = tampered_run
    run = manifest.run_id

    async def main():
        worker = ReplayWorker()
        try:
            with trio.fail_after(240):
                async with AsyncExitStack() as stack:
                    a, spammer, verifier = [await stack.enter_async_context(open_p2p(ident(63 + i), "127.0.0.1", 0))
                                            for i in range(3)]
                    server = AnswerServer(worker, {run: manifest}, lambda r: run_dir, tmp_path / "spot", timeout_s=120,
                                          stats=NodeStats(), penalise=a.penalise)
                    a.set_stream_handler(SPOTCHECK_PROTOCOL, server.serve)
                    for peer in (spammer, verifier):
                        await peer.connect(a.addrs[0])
                    done = trio.Event()
                    spam = challenge_signature(spammer.identity, run, 1)
                    answers = []

                    async def spam_loop():
                        while not done.is_set():
                            answers.append(await ask(spammer, a.peer_id, run, 1, spam))
                            await trio.sleep(0)

                    async with trio.open_nursery() as nursery:
                        for _ in range(8):
                            nursery.start_soon(spam_loop)
                        got = await request_answer(verifier, _peers(a.peer_id), run, 2,
                                                   challenge_signature(verifier.identity, run, 2), deadline_s=120,
                                                   skip=set(), sleep=trio.sleep)
                        while spammer.peer_id not in a.banned:
                            await trio.sleep(0.05)
                        done.set()
                    assert got is not None and got[0] == a.peer_id
                    assert server.computed == 2  # the spammer's one answer and the verifier's
                    assert any(answer is not None for answer in answers)
                    assert verifier.peer_id not in a.rejected
        finally:
            await worker.aclose()

    trio.run(main)
