"""The referee off the event loop (node/referee_worker.py): a fraud proof from gossip, sync or a
fetch by reference is judged in a worker thread while the node's other tasks run, with the same
verdict (the node's own proof, judged by its bisection, is read there without the referee); two
at a time node-wide (one large, one small), a bound per gossip peer, identical bytes judged once."""

from __future__ import annotations

import random
import threading

import pytest
import trio
import trio.testing

import open1b.node.fraud_proofs as fraud_proofs
from open1b.node import fraud_proof_fetch
from open1b.node.clock import Clock
from open1b.node.dispute_agent import DisputeAgent, DisputeInbox
from open1b.node.dispute_exchange import Timing
from open1b.node.disputes import DisputeResult
from open1b.node.fraud_proof_fetch import ProofFetcher
from open1b.node.fraud_proof_refs import FraudProofRef
from open1b.node.fraud_proofs import Bearing
from open1b.node.referee_worker import MAX_JUDGING_PER_PEER, RefereeWorker
from open1b.node.topics import fraud_proofs_topic
from open1b.protocol import FraudVerdict, Outcome
from open1b.protocol.dispute import MAX_FRAUD_PROOF_SIZE
from open1b.protocol.hashing import blake2b256

from .conftest import ident
from .fakes import FakeGossip, make_ledger
from .test_fraud_proof_refs import BIG, MANIFEST, PUBLISHER, STEP, T0
from .test_fraud_proofs import AUDITOR
from .test_fraud_proofs import MANIFEST as SMALL_MANIFEST
from .test_fraud_proofs import proof as small_proof

REFEREE = fraud_proofs.verify_fraud_proof
NOTHING_KNOWN = Bearing({}.get, lambda *key: False, lambda key: False, lambda *key: False, lambda *key: False,
                        lambda ranked: True)


class _Gossip(FakeGossip):
    peer_id = "me"

    def set_stream_handler(self, protocol, handler) -> None:
        pass


def _ledger(tmp_path):
    return make_ledger(tmp_path, MANIFEST, SMALL_MANIFEST, identity=ident(9), clock=Clock(wall_at_zero=T0),
                       gossip=_Gossip())


async def _judged_while_another_task_runs(monkeypatch, judge, costly: str = "verify_fraud_proof",
                                          ) -> tuple[object, list[bool]]:
    """``await judge()`` with the real referee (or ``costly``, another function node/fraud_proofs.py
    calls), which first hands the event loop a task to run and waits until that task has run. In
    a worker thread it has; on the event loop nothing else can run until the referee returns, so
    the wait ends only at its deadline, unmet."""
    token = trio.lowlevel.current_trio_token()
    entered, ran = trio.Event(), threading.Event()
    met: list[bool] = []
    real = getattr(fraud_proofs, costly)

    def referee(data):
        token.run_sync_soon(entered.set)
        met.append(ran.wait(timeout=20))  # a deadlock's bound only: met at once when the loop is free
        return real(data)

    async def other_task():
        await entered.wait()
        ran.set()

    with monkeypatch.context() as patch:
        patch.setattr(fraud_proofs, costly, referee)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(other_task)
            result = await judge()
    return result, met


def test_a_fetched_large_proof_is_judged_while_the_event_loop_runs_on(tmp_path, monkeypatch):
    ledger = _ledger(tmp_path)
    fetcher = ProofFetcher(_Gossip(), ledger.statements, ledger.outbox.regossip, tmp_path / "spool")
    ref = FraudProofRef(MANIFEST.run_id, STEP, blake2b256(BIG), len(BIG), (PUBLISHER.public_key,))

    async def served(p2p, peer, wanted, spool):
        spool.write(BIG)
        return True

    monkeypatch.setattr(fraud_proof_fetch, "fetch_fraud_proof", served)
    _, met = trio.run(_judged_while_another_task_runs, monkeypatch, lambda: fetcher.fetch(ref, "holder"))
    assert met == [True]
    assert fetcher.fetched == {"stored": 1}  # the verdict is the referee's own
    assert [f.digest for f in ledger.store.fraud.of_run(MANIFEST.run_id)] == [blake2b256(BIG)]


def test_a_gossiped_or_synced_proof_is_judged_while_the_event_loop_runs_on(tmp_path, monkeypatch):
    ledger = _ledger(tmp_path)
    data = small_proof(AUDITOR, PUBLISHER)
    gossiped, met = trio.run(_judged_while_another_task_runs, monkeypatch,
                             lambda: ledger.statements.validator("fraud_proof")("peer", "author", data))
    assert gossiped is Outcome.ACCEPT and met == [True]
    synced, met = trio.run(_judged_while_another_task_runs, monkeypatch,
                           lambda: ledger.statements.ingest_synced([data], "peer"))
    assert synced == 1 and met == [True]
    assert [f.digest for f in ledger.store.fraud.of_run(SMALL_MANIFEST.run_id)] == [blake2b256(data)]


def test_the_nodes_own_proof_is_carried_while_the_event_loop_runs_on(tmp_path, monkeypatch):
    """The proof a dispute of this node's ended in (node/dispute_agent.py) comes with the verdict
    its bisection's referee gave it: the agent decodes and hashes it (up to 128 MiB) in a worker
    thread, without the referee (node/test_dispute_agent.py counts its runs), then stores and
    gossips it; a verdict that convicts no one carries nothing."""
    ledger = _ledger(tmp_path)
    agent = DisputeAgent(ident(9), _Gossip(), None, DisputeInbox(), runs=ledger.manifests, store=ledger.store,
                         counting=ledger.counting, fetcher=None, publish=ledger.outbox.publish,
                         referee=ledger.statements.referee, clock=Clock(), rng=random.Random(0),
                         stats=ledger.statements.stats, timing=Timing(60, trace_timeout_s=60))
    refused = small_proof(AUDITOR, PUBLISHER, forged=True)
    trio.run(agent._publish, DisputeResult("proof", proof=refused, verdict=REFEREE(refused)))
    assert ledger.store.fraud.of_run(SMALL_MANIFEST.run_id) == []
    data = small_proof(AUDITOR, PUBLISHER)
    result = DisputeResult("proof", proof=data, verdict=REFEREE(data))  # as the bisection judged it
    _, met = trio.run(_judged_while_another_task_runs, monkeypatch, lambda: agent._publish(result), "blake2b256")
    assert met == [True]
    assert [f.digest for f in ledger.store.fraud.of_run(SMALL_MANIFEST.run_id)] == [blake2b256(data)]
    assert ledger.statements.gossip.published == [(fraud_proofs_topic(SMALL_MANIFEST.run_id), data)]


class _HeldReferee:
    """A stand-in for the referee that returns only when the test releases it, counting calls."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.judged: list[bytes] = []
        self._entered = threading.Semaphore(0)

    def __call__(self, data: bytes) -> FraudVerdict:
        self.judged.append(data)
        self._entered.release()
        assert self.release.wait(timeout=20)
        return FraudVerdict(Outcome.REJECT, "reads", "held")

    async def entered(self) -> None:
        """Until one more call has begun (in its thread)."""
        await trio.to_thread.run_sync(self._entered.acquire)


@pytest.fixture
def held(monkeypatch) -> _HeldReferee:
    held = _HeldReferee()
    monkeypatch.setattr(fraud_proofs, "verify_fraud_proof", held)
    return held


def test_a_gossip_peer_has_at_most_its_bound_of_proofs_judged_and_others_still_wait_their_turn(held):
    worker = RefereeWorker(NOTHING_KNOWN)
    verdicts: dict[bytes, str] = {}

    async def judge(data, peer):
        verdicts[data] = (await worker.referee(data, peer=peer)).code

    async def main():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(judge, b"p0", "p")
            await held.entered()
            for i in range(1, MAX_JUDGING_PER_PEER):  # one by one: trio runs tasks started together in any order
                nursery.start_soon(judge, b"p%d" % i, "p")
                await trio.testing.wait_all_tasks_blocked()
            await judge(b"p-more", "p")  # at once: not waiting behind the others
            assert verdicts == {b"p-more": "referee_busy"}
            nursery.start_soon(judge, b"q0", "q")  # another peer's waits its turn
            await trio.testing.wait_all_tasks_blocked()
            assert held.judged == [b"p0"]  # one small proof at a time
            held.release.set()
        assert verdicts == {**{b"p%d" % i: "reads" for i in range(MAX_JUDGING_PER_PEER)},
                            b"p-more": "referee_busy", b"q0": "reads"}
        assert held.judged == [b"p%d" % i for i in range(MAX_JUDGING_PER_PEER)] + [b"q0"]  # in arrival order
        assert worker._per_peer == {} and worker._judging == {}
        assert (await worker.referee(b"p-again", peer="p")).code == "reads"  # its bound is free again

    trio.run(main)


def test_identical_bytes_are_judged_once_and_a_large_proof_holds_up_no_small_one(held):
    worker = RefereeWorker(NOTHING_KNOWN)
    large = b"\0" * (fraud_proofs.MAX_GOSSIP_FRAUD_PROOF + 1)
    verdicts: list[tuple[str, str]] = []

    async def judge(name, data, **kw):
        verdicts.append((name, (await worker.referee(data, **kw)).code))

    async def main():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: judge("large", large, max_size=MAX_FRAUD_PROOF_SIZE))
            await held.entered()
            for peer in ("a", "b", "c"):  # one message from three mesh peers
                nursery.start_soon(lambda peer=peer: judge(peer, b"same", peer=peer))
            await held.entered()  # while the large one is still being judged
            await trio.testing.wait_all_tasks_blocked()
            assert held.judged == [large, b"same"]  # both at once: the small one is not behind the large
            held.release.set()
        assert sorted(verdicts) == [("a", "reads"), ("b", "reads"), ("c", "reads"), ("large", "reads")]
        assert held.judged == [large, b"same"]
        # over the caller's bound: refused unread, in no thread
        assert (await worker.referee(large)).code == "oversize" and len(held.judged) == 2

    trio.run(main)


def test_a_judgment_cancelled_while_waiting_leaves_its_bytes_to_the_next_caller(held):
    """py-libp2p cancels a validation past its timeout: one that waits for the referee then hands
    its bytes to whoever waits on them, which judges them itself."""
    worker = RefereeWorker(NOTHING_KNOWN)
    verdicts = []

    async def cancellable(data, *, task_status=trio.TASK_STATUS_IGNORED):
        with trio.CancelScope() as scope:
            task_status.started(scope)
            await worker.referee(data)

    async def judge(data):
        verdicts.append((await worker.referee(data)).code)

    async def main():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(judge, b"first")
            await held.entered()
            scope = await nursery.start(cancellable, b"second")
            await trio.testing.wait_all_tasks_blocked()  # it waits for the referee, owning b"second"
            nursery.start_soon(judge, b"second")  # the same bytes: waits on the first caller's judgment
            await trio.testing.wait_all_tasks_blocked()
            scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            held.release.set()
        assert verdicts == ["reads", "reads"] and held.judged == [b"first", b"second"]
        assert worker._judging == {}

    trio.run(main)
