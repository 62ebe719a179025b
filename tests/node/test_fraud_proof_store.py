"""Which fraud proofs a node stores, relays and serves (docs/protocol.md §18.7, r25): only those
that bear on its coverage — convicting the run's publisher, or a key its trust policy counts that
attested the step — at most one per (run, step, guilty key) and a bounded number and size per run;
each judged once, its verdict kept by digest, so reading them back (coverage, sync, the API)
runs no referee and loads no proof's bytes."""

from __future__ import annotations

import sqlite3

import trio

import open1b.node.fraud_proof_store as store_module
import open1b.node.fraud_proofs as fraud_proofs
from open1b.node.clock import Clock
from open1b.node.fraud_proof_refs import FraudProofRef, judge_fraud_proof_ref
from open1b.node.topics import fraud_proofs_topic
from open1b.protocol import Outcome
from open1b.protocol.hashing import blake2b256
from tests.protocol.conftest import make_attestation

from .conftest import ident
from .fakes import FakeGossip, make_ledger
from .test_fraud_proofs import AUDITOR, MANIFEST, OTHER, PUBLISHER, STEP, T0, proof

SYBILS = [ident(40 + i) for i in range(6)]


def _ledger(tmp_path, **config):
    gossip = FakeGossip()
    ledger = make_ledger(tmp_path, MANIFEST, identity=OTHER, clock=Clock(wall_at_zero=T0), gossip=gossip, **config)
    trio.run(ledger.statements.join_known_runs)
    return ledger, gossip.validators[fraud_proofs_topic(MANIFEST.run_id)]


def _attest(ledger, *keys) -> None:
    for key in keys:
        ledger.statements.ingest_attestation(make_attestation(key, MANIFEST, STEP, match=False).encoded)


def test_sybil_keys_that_attested_a_step_cannot_make_a_node_store_or_relay_their_made_up_disputes(tmp_path):
    ledger, validate = _ledger(tmp_path)  # the default policy: the listed keys only
    _attest(ledger, *SYBILS)
    pairs = [(SYBILS[i], SYBILS[(i + 1) % len(SYBILS)]) for i in range(len(SYBILS))]
    for honest, liar in pairs:
        data = proof(honest, liar)
        assert trio.run(validate, "peer", "peer", data) is Outcome.IGNORE  # not relayed: the router drops it
        assert not trio.run(ledger.statements.ingest_fraud_proof, data, "syncer")
    assert ledger.store.fraud.of_run(MANIFEST.run_id) == []
    assert ledger.statements.validation["fraud_proof/ignore/not_counted"] == len(pairs)
    assert ledger.statements.validation["sync/ignore/not_counted"] == len(pairs)
    assert ledger.statements.gossip.penalised == []  # an honest node may have relayed it: ignored, never held against it
    # nor is a reference to one fetched
    ref = FraudProofRef(MANIFEST.run_id, STEP, b"\x01" * 32, 2 << 20, (SYBILS[1].public_key,))
    verdict = judge_fraud_proof_ref(ref.encoded, ledger.statements.bearing)
    assert (verdict.outcome, verdict.code) == (Outcome.IGNORE, "not_counted")


def test_a_proof_convicting_a_counted_key_is_stored_once(tmp_path):
    ledger, validate = _ledger(tmp_path, trusted_peers=(AUDITOR.peer_id,))
    _attest(ledger, AUDITOR)
    low, high = sorted([proof(PUBLISHER, AUDITOR), proof(OTHER, AUDITOR)], key=blake2b256)
    assert trio.run(validate, "peer", "peer", high) is Outcome.ACCEPT
    assert trio.run(ledger.statements.ingest_fraud_proof, high)
    assert trio.run(ledger.statements.ingest_fraud_proof, low)  # the lower digest replaces it
    assert not trio.run(ledger.statements.ingest_fraud_proof, high)
    [stored] = ledger.store.fraud.of_run(MANIFEST.run_id)
    assert (stored.digest, stored.guilty, stored.size) == (blake2b256(low), (AUDITOR.public_key,), len(low))
    assert ledger.store.fraud.body(MANIFEST.run_id, blake2b256(low)) == low
    assert ledger.store.fraud.body(MANIFEST.run_id, blake2b256(high)) is None  # replaced: its bytes are gone


def test_the_gossip_validator_relays_only_a_proof_the_store_would_keep(tmp_path):
    # what the router forwards follows the store's decision: a proof already kept, or one whose
    # every conviction a kept proof makes redundant (a higher digest of it), is ignored, not
    # relayed again under each author that gossips it; nobody is penalised for it
    ledger, validate = _ledger(tmp_path, trusted_peers=(AUDITOR.peer_id,))
    _attest(ledger, AUDITOR)
    low, high = sorted([proof(PUBLISHER, AUDITOR), proof(OTHER, AUDITOR)], key=blake2b256)
    assert trio.run(validate, "peer", "peer", low) is Outcome.ACCEPT
    assert trio.run(ledger.statements.ingest_fraud_proof, low)  # the handler stores what was accepted
    for redundant in (low, high):
        assert not ledger.store.fraud.add(trio.run(ledger.statements.referee.referee, redundant).message)
        assert trio.run(validate, "other", "other", redundant) is Outcome.IGNORE
    assert ledger.statements.validation["fraud_proof/ignore/held"] == 2
    assert not trio.run(ledger.statements.ingest_fraud_proof, high, "syncer")
    assert ledger.statements.validation["sync/ignore/held"] == 1
    assert ledger.statements.gossip.penalised == []


def test_a_conviction_already_kept_stays_relevant_after_it_flags_its_key(tmp_path):
    # a conviction flags the key it convicts; the other party's proof of it (a lower digest) must
    # still replace the one kept, or two nodes would cite different proofs of one conviction
    ledger, _ = _ledger(tmp_path, trusted_peers=(AUDITOR.peer_id,))
    _attest(ledger, AUDITOR)
    low, high = sorted([proof(PUBLISHER, AUDITOR), proof(OTHER, AUDITOR)], key=blake2b256)
    assert trio.run(ledger.statements.ingest_fraud_proof, high)
    assert ledger.judge.refresh() and not ledger.counting.counts(MANIFEST.run_id, AUDITOR.public_key)
    assert trio.run(ledger.statements.ingest_fraud_proof, low)
    assert [f.digest for f in ledger.store.fraud.of_run(MANIFEST.run_id)] == [blake2b256(low)]


def _many(tmp_path, order):
    """Under the open policy every key counts: one proof convicting each Sybil, heard in ``order``."""
    ledger, _ = _ledger(tmp_path, trust_policy="open")
    _attest(ledger, *SYBILS)
    proofs = [proof(PUBLISHER, s) for s in SYBILS]
    for i in order:
        trio.run(ledger.statements.ingest_fraud_proof, proofs[i])
    return ledger, proofs


def test_a_run_keeps_a_bounded_count_of_proofs_the_same_ones_whatever_the_order_heard(tmp_path, monkeypatch):
    monkeypatch.setattr(store_module, "MAX_RUN_FRAUD_PROOFS", 4)
    forward, proofs = _many(tmp_path / "a", range(len(SYBILS)))
    backward, _ = _many(tmp_path / "b", reversed(range(len(SYBILS))))
    kept = sorted(blake2b256(p) for p in proofs)[:4]  # one step, no publisher: the lowest digests
    for ledger in (forward, backward):
        assert sorted(f.digest for f in ledger.store.fraud.of_run(MANIFEST.run_id)) == kept
        assert ledger.store._db.execute("SELECT COUNT(*) FROM fraud_proof_bodies").fetchone()[0] == 4
    # a proof the bound would drop is not accepted (nor relayed), and a reference to one not fetched
    dropped = max(proofs, key=blake2b256)
    assert trio.run(forward.statements.referee.judge, dropped).code == "run_full"
    ref = FraudProofRef(MANIFEST.run_id, STEP, blake2b256(dropped), 2 << 20, (SYBILS[proofs.index(dropped)].public_key,))
    assert not forward.store.fraud.fits(ref)


def test_a_publishers_conviction_outranks_others_at_the_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(store_module, "MAX_RUN_FRAUD_PROOFS", 2)
    ledger, proofs = _many(tmp_path, range(len(SYBILS)))
    refutes = proof(AUDITOR, PUBLISHER)
    assert trio.run(ledger.statements.ingest_fraud_proof, refutes)
    digests = [f.digest for f in ledger.store.fraud.of_run(MANIFEST.run_id)]
    assert len(digests) == 2 and blake2b256(refutes) in digests
    assert ledger.judge.coverage(MANIFEST.run_id).refuted_steps == [STEP]


def test_a_run_keeps_a_bounded_size_of_proofs(tmp_path, monkeypatch):
    size = len(proof(PUBLISHER, SYBILS[0]))
    monkeypatch.setattr(store_module, "MAX_RUN_FRAUD_PROOF_BYTES", 3 * size)
    ledger, proofs = _many(tmp_path, range(len(SYBILS)))
    stored = ledger.store.fraud.of_run(MANIFEST.run_id)
    assert len(stored) == 3 and sum(f.size for f in stored) <= 3 * size


def _counted_referee(monkeypatch) -> list[bytes]:
    calls: list[bytes] = []
    real = fraud_proofs.verify_fraud_proof

    def referee(data):
        calls.append(data)
        return real(data)
    monkeypatch.setattr(fraud_proofs, "verify_fraud_proof", referee)
    return calls


def test_coverage_sync_and_the_api_read_verdicts_without_the_referee_or_the_bytes(tmp_path, monkeypatch):
    ledger, _ = _ledger(tmp_path, trust_policy="open")
    _attest(ledger, *SYBILS)
    proofs = [proof(PUBLISHER, s) for s in SYBILS] + [proof(AUDITOR, PUBLISHER)]
    calls = _counted_referee(monkeypatch)
    for data in proofs:
        assert trio.run(ledger.statements.ingest_fraud_proof, data)
    assert len(calls) == len(proofs)  # judged once each, on arrival
    statements: list[str] = []
    ledger.store._db.set_trace_callback(statements.append)
    cov = ledger.judge.coverage(MANIFEST.run_id)
    assert cov.refuted_steps == [STEP] and len(cov.flagged) == len(proofs)
    assert [f.digest for f in ledger.store.fraud.of_run(MANIFEST.run_id)]
    assert not any("encoded" in s for s in statements if "fraud" in s)  # no proof's bytes read for coverage
    served = ledger.statements.statements_for_sync(MANIFEST.run_id)
    assert sorted(s.encoded for s in served if s.encoded in proofs) == sorted(proofs)  # bytes read as sent
    assert len(calls) == len(proofs)  # and no referee ran on any read


def _reopened(tmp_path, told: list) -> object:
    """The node's ledger over the store in ``tmp_path`` again, as a restarted daemon opens it;
    what its statements tell the listeners goes to ``told``."""
    ledger, _ = _ledger(tmp_path, trusted_peers=(AUDITOR.peer_id,))
    ledger.statements.listeners.append(told.append)
    return ledger


def _judge_stored_again(ledger):
    """The daemon's task (node/daemon.py wires it so)."""
    return ledger.statements.referee.judge_stored_again(ledger.store.fraud, ledger.statements.tell)


def test_a_proof_judged_by_another_referee_is_judged_again_after_the_store_opens_and_read_out_only_then(
        tmp_path, monkeypatch):
    """A new referee judges the stored proofs again, in the daemon's background
    (``RefereeWorker.judge_stored_again``, in the referee's worker thread), not while the store opens
    (before, each ran there: up to seconds a proof, before the daemon served anything); until
    then coverage, sync and the API do not see them. One that no longer convicts is dropped."""
    from .test_referee_worker import _judged_while_another_task_runs

    ledger, _ = _ledger(tmp_path, trusted_peers=(AUDITOR.peer_id,))
    _attest(ledger, AUDITOR)
    good, bad = proof(PUBLISHER, AUDITOR), proof(AUDITOR, PUBLISHER)
    for data in (good, bad):
        assert trio.run(ledger.statements.ingest_fraud_proof, data)
    ledger.store.close()
    db = sqlite3.connect(tmp_path / "store.sqlite")
    with db:  # as if judged by an older referee; and one body damaged on disk
        db.execute("UPDATE fraud_proof_bodies SET referee = 'r19'")
        db.execute("UPDATE fraud_proof_bodies SET encoded = ? WHERE digest = ?", (bad[:-1] + b"\x00", blake2b256(bad)))
    db.close()
    calls, told = _counted_referee(monkeypatch), []
    ledger = _reopened(tmp_path, told)
    assert calls == []  # nothing judged while the store opened
    run = MANIFEST.run_id
    assert ledger.store.fraud.of_run(run) == [] and ledger.store.fraud.body(run, blake2b256(good)) is None
    cov = ledger.judge.coverage(run)
    assert cov.refuted_steps == [] and cov.flagged == ()  # pending: not counted
    assert [s.encoded for s in ledger.statements.statements_for_sync(run) if s.KIND == "fraud_proof"] == []
    _, met = trio.run(_judged_while_another_task_runs, monkeypatch, lambda: _judge_stored_again(ledger))
    assert met == [True, True] and len(calls) == 2  # each judged once, in the worker thread
    assert [f.digest for f in ledger.store.fraud.of_run(run)] == [blake2b256(good)]  # the damaged one dropped
    assert ledger.store.fraud.body(run, blake2b256(good)) == good
    assert [t.digest for t in told] == [blake2b256(good)]  # news for the judge and the planner
    cov = ledger.judge.coverage(run)
    assert cov.refuted_steps == [] and [f.signer for f in cov.flagged] == [AUDITOR.peer_id]
    assert ledger.store._db.execute("SELECT COUNT(*) FROM fraud_proof_bodies").fetchone() == (1,)
    ledger.store.close()
    ledger = _reopened(tmp_path, told)
    trio.run(_judge_stored_again, ledger)
    assert len(calls) == 2 and len(told) == 1  # judged under this referee now: not again


def test_a_store_of_the_old_layout_is_carried_over_judged_after_it_opens(tmp_path):
    data = proof(AUDITOR, PUBLISHER)
    db = sqlite3.connect(tmp_path / "store.sqlite")
    with db:
        db.execute("CREATE TABLE fraud_proofs (run_id BLOB NOT NULL, step INTEGER NOT NULL, guilty BLOB NOT NULL, "
                   "encoded BLOB NOT NULL, PRIMARY KEY (run_id, step, guilty))")
        db.execute("INSERT INTO fraud_proofs VALUES (?, ?, ?, ?)", (MANIFEST.run_id, STEP, PUBLISHER.public_key, data))
    db.close()
    told = []
    ledger = _reopened(tmp_path, told)
    store = ledger.store
    assert store.fraud.of_run(MANIFEST.run_id) == []
    trio.run(_judge_stored_again, ledger)
    [stored] = store.fraud.of_run(MANIFEST.run_id)
    assert (stored.digest, stored.guilty) == (blake2b256(data), (PUBLISHER.public_key,))
    assert [t.digest for t in told] == [blake2b256(data)]
    assert store._db.execute("SELECT name FROM sqlite_master WHERE name = 'fraud_proofs'").fetchone() is None
    assert ledger.judge.coverage(MANIFEST.run_id).refuted_steps == [STEP]


def _three_step_run():
    """A run whose h_1..h_3 are the traces' pre_states at those steps (dispute_cases: a function
    of the step), so that proofs of each of them are about it."""
    from tests.protocol.dispute_cases import kernel_case, traces_around
    from tests.runs import run_manifest

    from .test_fraud_proofs import np

    def pre(step):
        inputs, attrs, outputs = kernel_case("add", np.random.default_rng(5))
        return traces_around("add", inputs, attrs, outputs, (OTHER, PUBLISHER), step=step).traces[0].pre_state
    return run_manifest(PUBLISHER, engine="test-engine", engine_version="1", model={"d": 3}, data={}, seed=0,
                        steps=4, state_hashes=[pre(k) if 1 <= k <= 3 else blake2b256(b"h3", bytes([k]))
                                               for k in range(5)], created_at=T0 - 100)


def test_a_key_other_than_the_publisher_keeps_one_proof_its_earliest_conviction(tmp_path):
    # coverage flags such a key once, citing its lowest step's lowest digest (§8.3 step 9): its
    # other convictions change nothing, and one counted key must not fill the run's bound with them
    run = _three_step_run()
    liar = SYBILS[0]
    against = {k: proof(PUBLISHER, liar, run=run.run_id, step=k) for k in (1, 2, 3)}
    refutes = {k: proof(liar, PUBLISHER, run=run.run_id, step=k) for k in (1, 2)}
    for name, order in (("a", (2, 3, 1)), ("b", (1, 3, 2))):
        ledger = make_ledger(tmp_path / name, run, identity=OTHER, clock=Clock(wall_at_zero=T0),
                             trusted_peers=(liar.peer_id,))
        for k in (1, 2, 3):
            ledger.statements.ingest_attestation(make_attestation(liar, run, k, match=False).encoded)
        for k in order:
            trio.run(ledger.statements.ingest_fraud_proof, against[k])
        for data in refutes.values():  # the publisher's: one per step
            assert trio.run(ledger.statements.ingest_fraud_proof, data)
        assert sorted(f.digest for f in ledger.store.fraud.of_run(run.run_id)) == \
            sorted(blake2b256(p) for p in (against[1], *refutes.values()))
        assert ledger.store.fraud.holds(run.run_id, 3, (liar.public_key,), blake2b256(against[3]))  # a reference adds nothing


def test_a_daemon_serves_at_once_and_reads_out_a_proof_of_another_referee_once_judged_again(tmp_path):
    """The daemon wires it: it opens its store, serves, and judges the pending proofs meanwhile."""
    import random

    from open1b.node.config import NodeConfig
    from open1b.node.daemon import open_daemon

    from .fakes import FakeNetwork

    data_dir = tmp_path / "node"
    ledger, _ = _ledger(data_dir)
    data = proof(AUDITOR, PUBLISHER)  # convicts the publisher: kept whatever the policy
    assert trio.run(ledger.statements.ingest_fraud_proof, data)
    ledger.store.close()
    with sqlite3.connect(data_dir / "store.sqlite") as db:
        db.execute("UPDATE fraud_proof_bodies SET referee = 'r19'")
    db.close()

    async def main():
        config = NodeConfig(data_dir=data_dir, listen="127.0.0.1:0", api="127.0.0.1:0", audit=False)
        with trio.fail_after(60):
            async with open_daemon(config, clock=Clock(), rng=random.Random(0), network=FakeNetwork().open_node) as node:
                while not node.store.fraud.of_run(MANIFEST.run_id):
                    await trio.sleep(0.01)  # the referee's thread: no event of its own to wait on
                return node.ledger.judge.coverage(MANIFEST.run_id)

    assert trio.run(main).refuted_steps == [STEP]
