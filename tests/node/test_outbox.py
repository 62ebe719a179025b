"""The outbox (node/outbox.py): a node's own statement is stored before it is gossiped, a failed
gossip is tried again on the outbox's next round (virtual time), and every outcome is counted."""

from __future__ import annotations

import trio
from trio.testing import MockClock

from open1b.node.clock import Clock
from open1b.node.outbox import RETRY_S, TRIES
from open1b.node.p2p import NetworkError
from open1b.node.topics import attestations_topic
from open1b.protocol.hashing import blake2b256
from tests.runs import attestation, run_manifest

from .conftest import ident
from .fakes import FakeGossip, make_ledger

T0 = 1_800_000_000
MANIFEST = run_manifest(ident(0), engine="test-engine", engine_version="1", model={"d": 1}, data={}, seed=0,
                        steps=2, state_hashes=[blake2b256(b"h", bytes([k])) for k in range(3)], created_at=T0 - 100)


def own_attestation(step: int = 0):
    return attestation(ident(1), run=MANIFEST.run_id, step=step, pre_state=MANIFEST.state_hashes[step],
                       post_state=MANIFEST.state_hashes[step + 1], verdict="match", engine="test-engine",
                       engine_version="1", hardware="t", device="cpu/x86_64-avx2", elapsed_ms=1, issued_at=T0)


class FlakyGossip(FakeGossip):
    """Refuses the first ``failures`` publishes; on each, checks the statement is stored already."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures, self.stored_first, self.store = failures, [], None
        self.delivered = trio.Event()

    async def publish(self, topic, data):
        self.stored_first.append(data in {a.encoded for a in self.store.attestations(MANIFEST.run_id)})
        if self.failures:
            self.failures -= 1
            raise NetworkError("no peer on the topic yet")
        await super().publish(topic, data)
        self.delivered.set()


def _ledger(tmp_path, gossip):
    ledger = make_ledger(tmp_path, MANIFEST, identity=ident(1), clock=Clock(wall_at_zero=T0), gossip=gossip)
    gossip.store = ledger.store
    return ledger


def test_a_statement_is_stored_then_gossiped_once_and_counted(tmp_path):
    gossip = FlakyGossip(failures=0)
    ledger = _ledger(tmp_path, gossip)
    att = own_attestation()

    async def main():
        assert await ledger.outbox.publish(att)
        assert not await ledger.outbox.publish(att)  # held already: neither stored nor gossiped again

    trio.run(main)
    assert gossip.published == [(attestations_topic(MANIFEST.run_id), att.encoded)] and gossip.stored_first == [True]
    assert ledger.statements.stats.own_statements == {("attestation", "gossiped"): 1}
    # stored through the statements: the planner's view counts it as ours at once
    assert ledger.planner.index(MANIFEST.run_id).mine == {0}


def test_a_failed_gossip_is_retried_on_the_next_round_and_counted(tmp_path):
    gossip = FlakyGossip(failures=2)
    ledger = _ledger(tmp_path, gossip)
    att = own_attestation()

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(ledger.outbox.serve_outbox)
            assert await ledger.outbox.publish(att)  # stored; the gossip failed, and that is not the caller's
            assert gossip.published == []
            with trio.fail_after(10 * RETRY_S):
                await gossip.delivered.wait()
            nursery.cancel_scope.cancel()
        return trio.current_time()

    assert trio.run(main, clock=MockClock(autojump_threshold=0)) == 2 * RETRY_S  # two rounds: one more failure
    assert gossip.published == [(attestations_topic(MANIFEST.run_id), att.encoded)]
    assert gossip.stored_first == [True, True, True]
    assert ledger.statements.stats.own_statements == {("attestation", "retried"): 1}


def test_a_gossip_that_keeps_failing_is_left_to_sync_after_its_tries(tmp_path):
    gossip = FlakyGossip(failures=100)
    ledger = _ledger(tmp_path, gossip)
    att = own_attestation()

    async def main():
        await ledger.outbox.publish(att)
        for _ in range(TRIES + 2):
            await ledger.outbox.retry()

    trio.run(main)
    assert len(gossip.stored_first) == TRIES  # the first try, then TRIES - 1 retries, then no more
    assert ledger.statements.stats.own_statements == {("attestation", "failed"): 1}
    assert ledger.statements.statements_for_sync(MANIFEST.run_id) == [att]  # sync still serves it
