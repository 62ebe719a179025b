"""Fraud proofs as statements (node/fraud_proofs.py): the run's gossip topic and its validator
(the referee's REJECT and IGNORE, then the node's rules), stored once per conviction, read back
with the verdict judged on arrival, published through the outbox, served by the API and by sync."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
import trio

from open1b.node.clock import Clock
from open1b.node.fraud_proofs import MAX_GOSSIP_FRAUD_PROOF, ProvenFraud, judge_fraud_proof
from open1b.node.p2p import MAX_PUBSUB_MESSAGE
from open1b.node.topics import fraud_proofs_topic, statement_topic
from open1b.protocol import Outcome, StepStatus
from open1b.protocol.hashing import blake2b256
from open1b.protocol.identity import peer_id_from_public_key
from tests.protocol.conftest import make_attestation
from tests.protocol.dispute_cases import kernel_case, traces_around
from tests.runs import run_manifest

from .conftest import ident
from .fakes import FakeGossip, make_ledger

T0 = 1_800_000_000
STEP = 3
PUBLISHER, AUDITOR, OTHER, STRANGER = ident(0), ident(1), ident(2), ident(3)


def _add_case():
    return kernel_case("add", np.random.default_rng(5))


def _states() -> tuple[bytes, bytes]:
    """h_3 of the traces dispute_cases builds, and the forger's post_state (functions of the op,
    not of the run or the signers): the run below publishes the forger's state as h_4."""
    inputs, attrs, outputs = _add_case()
    traces = traces_around("add", inputs, attrs, outputs, (OTHER, PUBLISHER)).traces
    return traces[0].pre_state, traces[1].post_state


STATES = {STEP: _states()[0], STEP + 1: _states()[1]}
MANIFEST = run_manifest(PUBLISHER, engine="test-engine", engine_version="1", model={"d": 1}, data={}, seed=0,
                        steps=5, state_hashes=[STATES.get(k, blake2b256(b"h", bytes([k]))) for k in range(6)],
                        created_at=T0 - 100)


def proof(honest, liar, *, run=MANIFEST.run_id, step=STEP, forged=False) -> bytes:
    """A proof that convicts ``liar`` (one ulp off in one element of an `add`); ``forged``: one
    bit of an input chunk flipped, which the referee refuses."""
    inputs, attrs, outputs = _add_case()
    p = traces_around("add", inputs, attrs, outputs, (honest, liar), run=run, step=step)
    if forged:
        first = p.reads[0][0]
        flipped = dataclasses.replace(first, data=bytes([first.data[0] ^ 1]) + first.data[1:])
        p = dataclasses.replace(p, reads=((flipped, *p.reads[0][1:]), *p.reads[1:]))
    return p.encode()


def _ledger(tmp_path, gossip=None):
    """A node (OTHER) whose policy counts AUDITOR's statements, not STRANGER's."""
    ledger = make_ledger(tmp_path, MANIFEST, identity=OTHER, clock=Clock(wall_at_zero=T0), gossip=gossip,
                         trusted_peers=(AUDITOR.peer_id,))
    trio.run(ledger.statements.join_known_runs)
    return ledger


def test_the_gossip_rules_in_order(tmp_path):
    gossip = FakeGossip()
    ledger = _ledger(tmp_path, gossip)
    validate = gossip.validators[fraud_proofs_topic(MANIFEST.run_id)]
    cases = [
        (proof(AUDITOR, PUBLISHER), Outcome.ACCEPT, None),  # the trainer's own trace convicts it
        (proof(AUDITOR, PUBLISHER, forged=True), Outcome.REJECT, "fraud_proof/reject/reads"),
        (b"\xa0", Outcome.REJECT, "fraud_proof/reject/kind"),
        (b"\x00" * (MAX_GOSSIP_FRAUD_PROOF + 1), Outcome.REJECT, "fraud_proof/reject/oversize"),
        (proof(AUDITOR, PUBLISHER, run=b"\x22" * 32), Outcome.IGNORE, "fraud_proof/ignore/unknown_run"),
        (proof(AUDITOR, PUBLISHER, step=2), Outcome.REJECT, "fraud_proof/reject/pre_state"),
        (proof(AUDITOR, PUBLISHER, step=5), Outcome.REJECT, "fraud_proof/reject/pre_state"),  # no step 5
        (proof(PUBLISHER, AUDITOR), Outcome.IGNORE, "fraud_proof/ignore/not_attested"),  # not yet
    ]
    for data, outcome, counted in cases:
        before = ledger.statements.validation.copy()
        assert trio.run(validate, "peer", "peer", data) is outcome, counted
        before.update([counted] if counted else [])
        assert ledger.statements.validation == before, counted  # the refusal counted under its code
    # once the auditor has attested the step, a proof convicting it bears on coverage
    ledger.statements.ingest_attestation(make_attestation(AUDITOR, MANIFEST, STEP, match=False).encoded)
    assert trio.run(validate, "peer", "peer", proof(PUBLISHER, AUDITOR)) is Outcome.ACCEPT
    # a key that attested it but that the policy does not count: its conviction changes nothing here (r25)
    ledger.statements.ingest_attestation(make_attestation(STRANGER, MANIFEST, STEP, match=False).encoded)
    assert trio.run(validate, "peer", "peer", proof(PUBLISHER, STRANGER)) is Outcome.IGNORE
    assert ledger.statements.validation["fraud_proof/ignore/not_counted"] == 1


def test_stored_once_per_conviction_and_read_back_as_judged(tmp_path):
    ledger = _ledger(tmp_path)
    told = []
    ledger.statements.listeners.append(told.append)
    data, other = sorted([proof(AUDITOR, PUBLISHER), proof(OTHER, PUBLISHER)], key=blake2b256)
    ingest = ledger.statements.ingest_fraud_proof
    assert trio.run(ingest, data, "peer")
    assert not trio.run(ingest, data, "peer")  # held already
    # another proof of the same conviction (another honest party) with a higher digest adds nothing
    assert not trio.run(ingest, other, "peer")
    # a refused proof from sync counts against its sender, as on gossip
    assert not trio.run(ingest, proof(AUDITOR, PUBLISHER, forged=True), "liar")
    assert ledger.store.fraud.of_run(b"\x22" * 32) == []
    [stored] = ledger.store.fraud.of_run(MANIFEST.run_id)
    assert [type(s) for s in told] == [ProvenFraud] and told[0].record == stored
    assert (stored.step, stored.op, stored.guilty) == (STEP, "add", (PUBLISHER.public_key,))
    assert ledger.store.fraud.body(MANIFEST.run_id, stored.digest) == data
    assert stored.to_json()["guilty"] == [peer_id_from_public_key(PUBLISHER.public_key)]
    assert stored.to_json()["digest"] == blake2b256(data).hex()
    assert ledger.statements.gossip.penalised == ["liar"]


def test_of_two_proofs_of_one_conviction_every_node_keeps_the_lower_digest(tmp_path):
    # the two parties of a dispute each build a proof (their own trace first): whichever a node
    # hears first, all end citing the same one
    low, high = sorted([proof(AUDITOR, PUBLISHER), proof(OTHER, PUBLISHER)], key=blake2b256)
    for name, order in (("a", (low, high)), ("b", (high, low))):
        ledger = _ledger(tmp_path / name)
        assert [trio.run(ledger.statements.ingest_fraud_proof, d, "peer") for d in order] == \
            ([True, False] if order[0] == low else [True, True])
        assert [f.digest for f in ledger.store.fraud.of_run(MANIFEST.run_id)] == [blake2b256(low)]
        assert ledger.judge.coverage(MANIFEST.run_id).steps[STEP].fraud_proofs == (blake2b256(low),)


def test_the_outbox_stores_then_gossips_a_proof_on_the_runs_topic(tmp_path):
    gossip = FakeGossip()
    ledger = _ledger(tmp_path, gossip)
    verdict = judge_fraud_proof(proof(AUDITOR, PUBLISHER), ledger.statements.bearing)
    fraud = verdict.message

    async def main():
        assert await ledger.outbox.publish(fraud)
        assert not await ledger.outbox.publish(fraud)

    trio.run(main)
    assert gossip.published == [(fraud_proofs_topic(MANIFEST.run_id), fraud.encoded)]
    assert statement_topic("fraud_proof", MANIFEST.run_id) == fraud_proofs_topic(MANIFEST.run_id)
    assert ledger.store.fraud.of_run(MANIFEST.run_id) == [fraud.record]


def test_the_gossip_bound_is_a_pubsub_message_less_its_envelope():
    assert MAX_GOSSIP_FRAUD_PROOF == MAX_PUBSUB_MESSAGE - 4096


def test_coverage_cites_a_stored_proof_refuting_the_publishers_step_and_flagging_an_auditor(tmp_path):
    ledger = _ledger(tmp_path)
    assert ledger.judge.coverage(MANIFEST.run_id).refuted_steps == []
    data = proof(AUDITOR, PUBLISHER)
    assert trio.run(ledger.statements.ingest_fraud_proof, data)
    cov = ledger.judge.coverage(MANIFEST.run_id)  # the default policy has no quorum: the proof alone
    assert cov.refuted_steps == [STEP] and cov.steps[STEP].fraud_proofs == (blake2b256(data),)
    assert [(f.signer, f.kind, f.statement) for f in cov.flagged] == [
        (peer_id_from_public_key(PUBLISHER.public_key), "fraud", blake2b256(data))]
    # an auditor that attested a mismatch and signed a losing trace is flagged by its proof
    ledger.statements.ingest_attestation(make_attestation(AUDITOR, MANIFEST, STEP, match=False).encoded)
    against = proof(PUBLISHER, AUDITOR)
    assert trio.run(ledger.statements.ingest_fraud_proof, against)
    assert ledger.judge.refresh()  # the judge re-judged the run and set the flags in the counting
    cov = ledger.judge.coverage(MANIFEST.run_id)
    assert {f.signer: f.statement for f in cov.flagged}[peer_id_from_public_key(AUDITOR.public_key)] == \
        blake2b256(against)
    assert AUDITOR.public_key in ledger.counting.flagged[MANIFEST.run_id]


async def _holder_and_joiner(tmp_path, holder_p2p, joiner_p2p, data: bytes, *joiner_knows):
    """A holder that stored the proof ``data`` and answers sync, and a joiner that knows the runs
    ``joiner_knows``: the joiner's ledger and its syncer."""
    from open1b.node.sync import Syncer

    holder = make_ledger(tmp_path / "holder", MANIFEST, clock=Clock(wall_at_zero=T0), gossip=holder_p2p)
    assert await holder.statements.ingest_fraud_proof(data)
    joiner = make_ledger(tmp_path / "joiner", *joiner_knows, clock=Clock(wall_at_zero=T0), gossip=joiner_p2p)
    Syncer(holder_p2p, holder.statements, holder.config, clock=holder.statements.clock,
           rng=random.Random(1), stats=holder.statements.stats)  # its handlers answer
    return joiner, Syncer(joiner_p2p, joiner.statements, joiner.config, clock=joiner.statements.clock,
                          rng=random.Random(1), stats=joiner.statements.stats)


def test_sync_serves_a_proof_to_a_node_that_missed_its_gossip(tmp_path):
    """Two real libp2p hosts: the holder stored a proof, the joiner knows the run but heard no
    gossip; one sync round brings it the proof, judged and stored as from gossip."""
    from open1b.node.p2p import open_p2p

    data = proof(AUDITOR, PUBLISHER)

    async def main():
        with trio.fail_after(60):
            async with open_p2p(ident(5), "127.0.0.1", 0) as holder_p2p, open_p2p(ident(6), "127.0.0.1", 0) as joiner_p2p:
                joiner, syncer = await _holder_and_joiner(tmp_path, holder_p2p, joiner_p2p, data, MANIFEST)
                peer = await joiner_p2p.connect(holder_p2p.addrs[0])
                assert await syncer.sync_with(peer) == 1
                assert [f.digest for f in joiner.store.fraud.of_run(MANIFEST.run_id)] == [blake2b256(data)]

    trio.run(main)


def test_a_late_joiner_learns_the_run_then_its_proof_through_sync_and_refutes_the_step(tmp_path):
    """Two real libp2p hosts: a node that knew neither the run nor the dispute (it joins after
    both) learns the manifest (the runs sync protocol), then the proof (the run's sync), and its
    coverage refutes the step citing that proof, with no attestation and no quorum."""
    from open1b.node.p2p import open_p2p

    data = proof(AUDITOR, PUBLISHER)

    async def main():
        with trio.fail_after(60):
            async with open_p2p(ident(5), "127.0.0.1", 0) as holder_p2p, open_p2p(ident(6), "127.0.0.1", 0) as joiner_p2p:
                joiner, syncer = await _holder_and_joiner(tmp_path, holder_p2p, joiner_p2p, data)
                assert joiner.statements.manifests == {}
                peer = await joiner_p2p.connect(holder_p2p.addrs[0])
                assert await syncer.sync_with(peer) == 2  # the manifest, then the proof
        cov = joiner.judge.coverage(MANIFEST.run_id)
        assert cov.refuted_steps == [STEP] and cov.steps[STEP].fraud_proofs == (blake2b256(data),)
        assert joiner.store.attestations(MANIFEST.run_id) == []

    trio.run(main)


def test_a_sync_response_with_too_many_large_frames_is_refused(tmp_path):
    from open1b.node.p2p import open_p2p
    from open1b.node.sync import MAX_SYNC_FRAUD_PROOFS, SYNC_PROTOCOL, pull_attestations
    from open1b.protocol.errors import WrongTypeError
    from open1b.protocol.messages import MAX_ATTESTATION_SIZE

    ingested = []

    async def ingest(frames):
        ingested.extend(frames)
        return 0

    async def flood(stream):
        await stream.receive(256)
        for _ in range(MAX_SYNC_FRAUD_PROOFS + 1):
            await stream.send(b"\x00" * (MAX_ATTESTATION_SIZE + 1))
        await stream.send(b"")

    async def main():
        with trio.fail_after(60):
            async with open_p2p(ident(7), "127.0.0.1", 0) as server, open_p2p(ident(8), "127.0.0.1", 0) as client:
                server.set_stream_handler(SYNC_PROTOCOL, flood)
                peer = await client.connect(server.addrs[0])
                with pytest.raises(WrongTypeError):
                    await pull_attestations(client, peer, MANIFEST.run_id, ingest)

    trio.run(main)
    assert len(ingested) == MAX_SYNC_FRAUD_PROOFS  # each large frame handed over alone, on arrival


def test_a_step_a_proof_refutes_is_no_longer_disputed_in_the_planners_view(tmp_path):
    """A counted mismatch makes a step disputed: it wants R + 1 attesters and ranks above every
    other step (§10). A proof convicting the publisher refutes it (§8.3): settled, it wants R like
    any step, as the planner's reference (candidates over coverage) reads it."""
    ledger = make_ledger(tmp_path, MANIFEST, identity=OTHER, clock=Clock(wall_at_zero=T0),
                         trusted_peers=(AUDITOR.peer_id,), redundancy=2)
    trio.run(ledger.statements.join_known_runs)
    ledger.statements.ingest_attestation(make_attestation(AUDITOR, MANIFEST, STEP, match=False).encoded)
    index = ledger.planner.index(MANIFEST.run_id)
    assert index.disputed(STEP) and index.deficit(STEP) == 2  # R + 1, less the one dissenter
    assert trio.run(ledger.statements.ingest_fraud_proof, proof(AUDITOR, PUBLISHER))
    assert ledger.judge.coverage(MANIFEST.run_id).steps[STEP].status is StepStatus.REFUTED
    index = ledger.planner.index(MANIFEST.run_id)
    assert not index.disputed(STEP) and index.deficit(STEP) == 1
    assert index.bucket(STEP) < index.bucket(STEP + 1)  # an unreplayed step (deficit 2) comes first now
