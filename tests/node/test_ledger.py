"""A node's ledger (node/ledger.py: statements validated → stored → judged) on trio's MockClock:
what it accepts depends on its clock, and its loops (the judge's flags, the replay proof's witness
reveals through the outbox) run on virtual seconds."""

from __future__ import annotations

from functools import partial

import pytest
import trio
from trio.testing import MockClock

from open1b.node.clock import Clock
from open1b.node.judge import JUDGE_EVERY_S
from open1b.node.replay_proof import REVEAL_EVERY_S
from open1b.node.topics import reveals_topic
from open1b.protocol import Outcome, StepStatus, WitnessReveal
from open1b.protocol.hashing import blake2b256
from open1b.protocol.validation import MAX_CLOCK_SKEW_SECONDS
from tests.runs import attestation, run_manifest, witness_of

from .conftest import ident
from .fakes import FakeGossip, make_ledger

T0 = 1_800_000_000  # wall time at trio time 0
MANIFEST = run_manifest(ident(0), engine="test-engine", engine_version="1", model={"d": 1}, data={}, seed=0,
                        steps=4, state_hashes=[blake2b256(b"h", bytes([k])) for k in range(5)], created_at=T0 - 100)


def att(signer: int, step: int, *, issued_at: int = T0, match: bool = True, witness: bytes | None = None):
    post = MANIFEST.state_hashes[step + 1] if match else blake2b256(b"wrong", bytes([step]))
    extra = {} if witness is None else {"witness": witness}
    return attestation(ident(signer), run=MANIFEST.run_id, step=step, pre_state=MANIFEST.state_hashes[step],
                       post_state=post, verdict="match" if match else "mismatch", engine="test-engine",
                       engine_version="1", hardware="t", device="cpu/x86_64-avx2", elapsed_ms=1, issued_at=issued_at,
                       **extra)


def test_a_statement_from_the_future_is_ignored_until_the_clock_reaches_it(tmp_path):
    ledger = make_ledger(tmp_path / "node", MANIFEST, clock=Clock(wall_at_zero=T0), trusted_peers=(ident(1).peer_id,))
    early = att(1, 0, issued_at=T0 + 3600)

    async def main():
        assert ledger.statements.validate_gossip_attestation("peer", early.encoded) is Outcome.IGNORE
        assert not ledger.statements.ingest_attestation(early.encoded, source="peer")
        await trio.sleep(3600 - MAX_CLOCK_SKEW_SECONDS)  # an hour, virtually
        assert ledger.statements.validate_gossip_attestation("peer", early.encoded) is Outcome.ACCEPT
        assert ledger.statements.ingest_attestation(early.encoded)
        [(_, received_ms)] = ledger.store.attestations_received(MANIFEST.run_id)
        assert received_ms == (T0 + 3600 - MAX_CLOCK_SKEW_SECONDS) * 1000  # recorded in virtual wall time too
        return trio.current_time()

    assert trio.run(main, clock=MockClock(autojump_threshold=0)) == 3600 - MAX_CLOCK_SKEW_SECONDS
    assert ledger.statements.validation["sync/ignore/future"] == 1 and ledger.statements.gossip.penalised == []  # not the sender's fault


def test_the_judgement_loop_flags_a_contradicted_key_within_a_virtual_second(tmp_path):
    trusted = tuple(ident(s).peer_id for s in (1, 2, 3))
    ledger = make_ledger(tmp_path / "node", MANIFEST, clock=Clock(wall_at_zero=T0), trusted_peers=trusted, redundancy=2)

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(ledger.judge.serve_judge)
            ledger.statements.ingest_attestation(att(1, 2).encoded)  # vouches for a state two replays refute
            for honest in (2, 3):
                ledger.statements.ingest_attestation(att(honest, 2, match=False).encoded)
            assert ledger.counting.flagged == {}  # judged by the loop, not on every statement
            await trio.sleep(JUDGE_EVERY_S * 1.5)
            assert ledger.counting.flagged[MANIFEST.run_id] == {ident(1).public_key}
            # and the planner stops counting it: step 2 is left to the keys that still count
            assert ident(1).public_key not in ledger.planner.index(MANIFEST.run_id).attesters(2)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=MockClock(autojump_threshold=0))


def test_the_reveal_loop_stores_and_gossips_a_witness_when_a_copy_of_our_replay_arrives(tmp_path):
    gossip = FakeGossip()
    trusted = tuple(ident(s).peer_id for s in (2, 3))
    ledger = make_ledger(tmp_path / "node", MANIFEST, identity=ident(1), clock=Clock(wall_at_zero=T0),
                         gossip=gossip, trusted_peers=trusted, redundancy=1)

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(ledger.proof.serve_reveals, ledger.outbox.publish, clock=ledger.statements.clock))
            ledger.proof.replayed(MANIFEST, 1, MANIFEST.state_hashes[2], witness_of(1))  # our own replay of step 1
            ledger.statements.ingest_attestation(att(2, 1).encoded)  # an honest replay binds W_1
            ledger.statements.ingest_attestation(att(3, 1, witness=b"\x04" * 32).encoded)  # a copy binds something else
            with trio.fail_after(10):
                while not gossip.published:
                    await trio.sleep(REVEAL_EVERY_S)
            nursery.cancel_scope.cancel()
        return trio.current_time()

    elapsed = trio.run(main, clock=MockClock(autojump_threshold=0))
    [(topic, data)] = gossip.published
    reveal = WitnessReveal.decode(data)
    assert topic == reveals_topic(MANIFEST.run_id) and reveal.step == 1 and reveal.witness == witness_of(1)
    assert reveal.issued_at == T0 + REVEAL_EVERY_S  # signed in the first round, at virtual wall time
    assert elapsed <= 2 * REVEAL_EVERY_S
    assert ledger.store.reveals(MANIFEST.run_id) == [reveal]  # stored, then gossiped


def test_eval_statements_have_their_topic_validator_and_are_stored(tmp_path):
    from open1b.node.topics import evals_topic
    from tests.vectors import fixtures

    run = fixtures.eval_manifest()
    ledger = make_ledger(tmp_path / "node", run, clock=Clock(wall_at_zero=fixtures.NOW))
    result = fixtures.evaluation(0, run, 2, verdict="result")
    off_schedule = fixtures.evaluation(1, run, 3)

    async def main():
        await ledger.statements.join_known_runs()
        validate = ledger.statements.gossip.validators[evals_topic(run.run_id)]
        assert validate("peer", result.encoded) is Outcome.ACCEPT
        assert validate("peer", off_schedule.encoded) is Outcome.REJECT
        assert ledger.statements.ingest_eval(result.encoded) and not ledger.statements.ingest_eval(result.encoded)  # once
        assert not ledger.statements.ingest_eval(off_schedule.encoded, source="peer")

    trio.run(main, clock=MockClock(autojump_threshold=0))
    assert ledger.store.evals(run.run_id) == [result]
    assert ledger.statements.validation["eval/reject/eval_state"] == 1 and ledger.statements.validation["sync/reject/eval_state"] == 1


def test_a_batch_stores_the_valid_frames_and_counts_each_bad_one_against_its_sender(tmp_path):
    ledger = make_ledger(tmp_path / "node", MANIFEST, clock=Clock(wall_at_zero=T0), trusted_peers=(ident(1).peer_id,))
    good = [att(1, 0), att(2, 1), att(3, 2)]
    forged = bytearray(att(4, 3).encoded)
    forged[-1] ^= 1  # the signature no longer verifies

    async def main():
        return ledger.statements.ingest_attestations([good[0].encoded, bytes(forged), good[1].encoded, b"\xff", good[2].encoded,
                                           good[0].encoded], source="peer")  # fmt: skip

    assert trio.run(main, clock=MockClock(autojump_threshold=0)) == 3
    assert {a.digest for a in ledger.store.attestations(MANIFEST.run_id)} == {a.digest for a in good}
    assert ledger.statements.stats.attestations_received == 3
    assert sum(n for key, n in ledger.statements.validation.items() if key.startswith("sync/reject/")) == 2
    assert ledger.statements.gossip.penalised == ["peer", "peer"]


def test_spot_checks_have_their_topic_validator_are_stored_and_never_count_as_replays(tmp_path):
    from open1b.node.topics import spotchecks_topic
    from open1b.protocol import SpotStatus
    from tests.vectors import fixtures

    run = fixtures.spot_manifest()
    ledger = make_ledger(tmp_path / "node", run, clock=Clock(wall_at_zero=fixtures.NOW), trust_policy="open")
    passed, failed = fixtures.spotcheck(1, run, 0), fixtures.spotcheck(2, run, 1, caught="sum")
    borrowed = fixtures.spotcheck(1, run, 2, challenge=fixtures.spotcheck(2, run, 2).challenge)

    async def main():
        await ledger.statements.join_known_runs()
        validate = ledger.statements.gossip.validators[spotchecks_topic(run.run_id)]
        assert validate("peer", passed.encoded) is Outcome.ACCEPT
        assert validate("peer", borrowed.encoded) is Outcome.REJECT
        assert ledger.statements.ingest_spotcheck(passed.encoded) and not ledger.statements.ingest_spotcheck(passed.encoded)  # once
        assert ledger.statements.ingest_spotcheck(failed.encoded)
        assert not ledger.statements.ingest_spotcheck(borrowed.encoded, source="peer")

    trio.run(main, clock=MockClock(autojump_threshold=0))
    assert ledger.store.spotchecks(run.run_id) == [passed, failed]
    assert ledger.statements.validation["spotcheck/reject/challenge"] == 1 and ledger.statements.validation["sync/reject/challenge"] == 1
    replay = ledger.judge.coverage(run.run_id)
    spot = ledger.judge.spot_coverage(run.run_id, replay)
    assert replay.count(StepStatus.VERIFIED) == 0  # a spot check is not a replay
    assert [s.status for s in spot.steps] == [SpotStatus.SPOT_CHECKED, SpotStatus.FAILED, SpotStatus.UNCHECKED,
                                              SpotStatus.UNCHECKED]
    assert spot.steps[1].caught == ("sum",)
    # step 0 checked once with p = 1/4, step 1 caught (x = 0, docs/protocol.md §8.7), steps 2-3
    # unchecked: a run with one forged step escaped with (3/4 + 0 + 1 + 1) / 4
    assert spot.escape_one == pytest.approx((0.75 + 0 + 2) / 4)
    # the node's default policy (its own key alone) counts none of them
    own = make_ledger(tmp_path / "own", run, clock=Clock(wall_at_zero=fixtures.NOW))
    assert own.statements.ingest_spotcheck(passed.encoded)
    assert own.judge.spot_coverage(run.run_id, own.judge.coverage(run.run_id)).escape_one == 1.0


def test_a_synced_run_is_counted_before_any_reader_can_see_it(tmp_path):
    """Joining a run's topics takes a network round; a status read during it (the late-joiner
    test's, on a loaded CI machine) must not see the run uncounted."""

    class SlowGossip(FakeGossip):
        def __init__(self) -> None:
            super().__init__()
            self.joined = trio.Event()

        async def subscribe(self, topic, handler) -> None:
            await self.joined.wait()

    gossip = SlowGossip()
    ledger = make_ledger(tmp_path / "node", clock=Clock(wall_at_zero=T0), gossip=gossip)

    async def main():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ledger.statements.ingest_manifest, MANIFEST.encoded, "peer")
            while MANIFEST.run_id not in ledger.manifests:
                await trio.sleep(0)
            assert ledger.statements.runs_synced == 1  # the run is visible, and already counted
            gossip.joined.set()
        assert ledger.statements.runs_synced == 1

    trio.run(main)
