"""The daemon's disputes (node/dispute_agent.py, node/dispute_tracer.py; docs/protocol.md §18.5
"When a node disputes"): whom a node disputes on learning an attestation, and the worker
process's traced replays, which must be the engine's trace of the step bit for bit. The whole
dispute between two daemons runs in the devnet scenarios (tests/scenarios/test_scenario_fraud_proofs.py)."""

from __future__ import annotations

import random
import tracemalloc

import cbor2
import trio
from trio.testing import MockClock

from open1b.deterministic.dispute_replay import op_data, trace_step
from open1b.node import disputes, fraud_proofs
from open1b.node.clock import Clock
from open1b.node.dispute_agent import DisputeAgent, DisputeInbox
from open1b.node.dispute_exchange import Timing
from open1b.node.dispute_tracer import StepTrace, WorkerTracer
from open1b.node.disputes import DisputeResult, Party, bisect
from open1b.node.op_data import OpFiles
from open1b.node.p2p import open_p2p
from open1b.node.worker import ReplayFailed, ReplayWorker
from open1b.protocol.codec import encode
from open1b.protocol.dispute import FraudProof, verify_fraud_proof
from open1b.protocol.dispute.bisection import DISPUTE_PROTOCOL, MAX_MESSAGE
from open1b.protocol.dispute.trace import TraceCommitment, chunk_tree, nbytes, trace_tree
from open1b.protocol.hashing import blake2b256
from tests.protocol.conftest import make_attestation
from tests.runs import run_manifest

from .conftest import ident
from .fakes import FakeGossip, make_ledger

PUBLISHER, ME, TRUSTED, STRANGER = ident(0), ident(1), ident(2), ident(3)


def _agent(tmp_path, manifest, me=ME, run_dir=None, p2p=None) -> DisputeAgent:
    ledger = make_ledger(tmp_path, manifest, identity=me, trusted_peers=(TRUSTED.peer_id,))
    if run_dir is not None:
        ledger.store.add_manifest(manifest, run_dir)
    return DisputeAgent(me, p2p or FakeGossip(), None, DisputeInbox(), runs=ledger.manifests, store=ledger.store,
                        counting=ledger.counting, fetcher=None, publish=ledger.outbox.publish,
                        referee=ledger.statements.referee, clock=Clock(),
                        rng=random.Random(0), stats=ledger.statements.stats, timing=Timing(60, trace_timeout_s=60))


def test_an_auditor_disputes_the_publisher_and_the_counted_keys_that_differ_from_its_replay(tmp_path, manifest):
    agent = _agent(tmp_path, manifest)
    store = agent.store
    trusted_match = make_attestation(TRUSTED, manifest, 2)
    stranger_match = make_attestation(STRANGER, manifest, 2)
    store.add_attestations([trusted_match, stranger_match])
    assert agent.opponents(trusted_match) == []  # no result of ours to differ from yet
    mine = make_attestation(ME, manifest, 2, match=False)
    store.add_attestation(mine)
    # the publisher, and the trusted key that matched; never the key we do not count
    assert agent.opponents(mine) == [PUBLISHER.public_key, TRUSTED.public_key]
    # a key that attests after us: disputed if counted and different
    other = make_attestation(TRUSTED, manifest, 3)
    store.add_attestation(make_attestation(ME, manifest, 3, match=False))
    assert agent.opponents(other) == [TRUSTED.public_key]
    assert agent.opponents(make_attestation(STRANGER, manifest, 3)) == []
    # our match: nobody to dispute, unless a counted key signed another result
    assert agent.opponents(make_attestation(ME, manifest, 4)) == []
    store.add_attestation(make_attestation(TRUSTED, manifest, 5, match=False))
    assert agent.opponents(make_attestation(ME, manifest, 5)) == [TRUSTED.public_key]


def test_a_publisher_disputes_a_counted_key_whose_result_is_not_its_published_state(tmp_path, manifest):
    agent = _agent(tmp_path, manifest, me=PUBLISHER, run_dir=tmp_path / "run")
    assert agent.my_post_state(manifest, 1) == manifest.state_hashes[2]
    assert agent.opponents(make_attestation(TRUSTED, manifest, 1, match=False)) == [TRUSTED.public_key]
    assert agent.opponents(make_attestation(TRUSTED, manifest, 1)) == []
    assert agent.opponents(make_attestation(STRANGER, manifest, 1, match=False)) == []
    # a node that published the run but holds no files of it has nothing to trace from
    assert _agent(tmp_path / "elsewhere", manifest, me=PUBLISHER).my_post_state(manifest, 1) is None


def _op_bytes(record: dict) -> int:
    return sum(nbytes(t["dtype"], t["shape"]) for t in record["inputs"] + record["outputs"])


def test_the_worker_traces_a_step_bit_for_bit_and_its_op_data_stays_on_disk(tmp_path, tampered_run):
    run_dir, manifest = tampered_run
    step = 2  # the forged one: the honest trace does not reach the published h_3
    op_files = OpFiles(tmp_path / "disputes", at_once=1)

    async def main():
        worker = ReplayWorker("cpu")
        try:
            with trio.fail_after(600):
                tracer = WorkerTracer(worker, tmp_path / "scratch", 300, op_files)
                traced = await tracer.trace(manifest, run_dir, step)
                # the op with the most bytes whose tensors are read in trace chunks (64 KiB)
                pos = max((r["pos"] for r in traced.records if r["kind"] != "adamw"),
                          key=lambda p: _op_bytes(traced.records[p]))
                tracemalloc.start()
                data = await tracer.op_data(manifest, run_dir, step, pos)
                roots = [await trio.to_thread.run_sync(chunk_tree, t) for t in
                         [i.data for i in data.inputs] + list(data.outputs)]
                peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
                held = list((tmp_path / "disputes").iterdir()), op_files.held.borrowed_tokens
                whole = ([(i.data.read(0, i.data.nbytes), i.state_proof) for i in data.inputs],
                         [o.read(0, o.nbytes) for o in data.outputs])
                data.close()
                return traced, pos, roots, peak, held, whole
        finally:
            await worker.aclose()

    traced, pos, roots, peak, held, (inputs, outputs) = trio.run(main)
    engine = trace_step(run_dir, manifest, step)
    assert traced.records == engine.trace.records and trace_tree(traced.records).root == engine.tree.root
    assert (traced.pre_state, traced.post_state) == (engine.pre_state, engine.post_state)
    assert traced.post_state != manifest.state_hashes[step + 1]
    engine_inputs, engine_outputs = op_data(run_dir, manifest, step, pos)
    assert inputs == [(i.data, i.state_proof) for i in engine_inputs] and outputs == engine_outputs
    record = traced.records[pos]
    assert [r.root for r in roots] == [t["root"] for t in record["inputs"] + record["outputs"]]
    # held on disk, unnamed (nothing left in the directory), one of the files the bound allows;
    # read in pieces: the daemon never held the op's bytes whole (it decoded them whole from the
    # worker's file before: twice the op's bytes at its peak; here 64 KiB pieces of 192 KiB)
    assert held == ([], 1) and op_files.held.borrowed_tokens == 0
    assert peak < 0.6 * _op_bytes(record), (peak, _op_bytes(record))
    assert list((tmp_path / "scratch").iterdir()) == []  # the worker's trace file is gone once read


def test_a_peers_next_dispute_is_answered_no_sooner_than_its_last_answer_took(tmp_path, manifest):
    server = _agent(tmp_path, manifest).server  # the agent's answering bound, as the server applies it

    async def main():
        assert server.admit("peer")
        await trio.sleep(5.0)  # the answer took 5 s of our worker
        server.on_result("peer", DisputeResult("agree"))
        assert not server.admit("peer") and server.admit("other")  # other peers are not held back
        await trio.sleep(4.9)
        assert not server.admit("peer")
        await trio.sleep(0.2)
        assert server.admit("peer")

    trio.run(main, clock=MockClock(autojump_threshold=0))


class _CountingTracer:
    """The worker's place: counts the traced replays asked of it (the CPU a dispute costs) and
    gives the tiny step's real records, from the run's published h_step."""

    def __init__(self, manifest, records) -> None:
        self.manifest, self.records, self.traced = manifest, records, []

    async def trace(self, manifest, run_dir, step):
        self.traced.append(step)
        return StepTrace(self.records, manifest.state_hashes[step], manifest.state_hashes[step + 1])

    async def op_data(self, manifest, run_dir, step, pos):
        raise AssertionError("no dispute here reaches an op's data")


async def _ask(agent_p2p, identity, manifest, step) -> dict:
    """``identity`` opens a dispute over ``step`` from a host of its own; the first answer."""
    async with open_p2p(identity, "127.0.0.1", 0) as host:
        await host.connect(agent_p2p.addrs[0])
        stream = await host.open_stream(agent_p2p.peer_id, DISPUTE_PROTOCOL)
        theirs = TraceCommitment.create(identity, run=manifest.run_id, step=step, pre_state=manifest.state_hashes[step],
                                        post_state=blake2b256(b"theirs", bytes([step])), ops=1, root=bytes(32))
        await stream.send(encode({"t": "trace", "trace": theirs.encoded}))
        return cbor2.loads(bytes(await stream.receive(MAX_MESSAGE)))


def test_a_node_answers_only_disputes_a_counted_key_warrants_once_each(tmp_path, manifest):
    """A trace is a full replay of the step: a node answers a dispute only from the run's
    publisher or a key it counts whose attestation of that step contradicts its own result, and
    once per (run, step, key). Before, fresh keys (each free) that opened disputes over distinct
    steps each got one traced replay: N keys, N replays."""
    from .dispute_parties import party

    records = party(ident(90)).records
    sybils = [ident(100 + i) for i in range(3)]

    async def main():
        with trio.fail_after(120):
            async with open_p2p(PUBLISHER, "127.0.0.1", 0) as p2p:
                agent = _agent(tmp_path, manifest, me=PUBLISHER, run_dir=tmp_path / "run", p2p=p2p)
                agent.tracer = tracer = _CountingTracer(manifest, records)
                p2p.set_stream_handler(DISPUTE_PROTOCOL, agent.handle)
                agent.store.add_attestations([make_attestation(sybils[0], manifest, 0, match=False),
                                              make_attestation(TRUSTED, manifest, 3, match=False),
                                              make_attestation(TRUSTED, manifest, 4)])
                flood = [await _ask(p2p, key, manifest, step) for step, key in enumerate(sybils)]
                assert tracer.traced == []
                assert flood == [{"t": "error", "code": "not_disputed"}] * 3  # its own attestation does not count
                assert (await _ask(p2p, TRUSTED, manifest, 4))["code"] == "not_disputed"  # it agrees with us
                assert (await _ask(p2p, TRUSTED, manifest, 3))["t"] == "trace" and tracer.traced == [3]
                with trio.fail_after(10):
                    while TRUSTED.peer_id in agent.engaged or not agent.server.admit(TRUSTED.peer_id):
                        await trio.sleep(0.05)  # its answer's session ends, and its pause after it
                assert (await _ask(p2p, TRUSTED, manifest, 3))["code"] == "not_disputed"  # answered once already
                assert tracer.traced == [3]

    trio.run(main)


def test_an_answer_our_worker_could_not_finish_pauses_the_peer_as_any_other(tmp_path, manifest):
    """A peer's next dispute is answered no sooner than its last answer took — also when the last
    one ended because our op data could not be computed (the worker failed after replaying): that
    path skipped the pause, so a counted peer could have the worker replay again at once."""
    from open1b.devnet.forged_op import ForgingBackend

    from .dispute_parties import party

    honest, forged = party(ident(90)), party(TRUSTED, ForgingBackend)
    step = 3

    class _FailingOpData(_CountingTracer):
        async def op_data(self, manifest, run_dir, step, pos):
            await trio.sleep(2.0)  # the worker replays to the op, then fails
            raise ReplayFailed("the worker died")

    async def main():
        with trio.fail_after(120):
            async with open_p2p(PUBLISHER, "127.0.0.1", 0) as p2p, open_p2p(TRUSTED, "127.0.0.1", 0) as opener:
                agent = _agent(tmp_path, manifest, me=PUBLISHER, run_dir=tmp_path / "run", p2p=p2p)
                agent.tracer = _FailingOpData(manifest, honest.records)
                p2p.set_stream_handler(DISPUTE_PROTOCOL, agent.handle)
                agent.store.add_attestation(make_attestation(TRUSTED, manifest, step, match=False))
                theirs = TraceCommitment.create(TRUSTED, run=manifest.run_id, step=step,
                                                pre_state=manifest.state_hashes[step], post_state=bytes(32),
                                                ops=forged.commitment.ops, root=forged.commitment.root)
                await opener.connect(p2p.addrs[0])
                stream = await opener.open_stream(p2p.peer_id, DISPUTE_PROTOCOL)
                result = await bisect(stream, Party(theirs, forged.tree, forged.records, forged.op_data))
                assert result.outcome == "peer_silent" and result.rounds > 0  # reset once our op data failed
                with trio.fail_after(10):
                    while (TRUSTED.peer_id, "not_held") not in {(d["peer"], d["outcome"])
                                                                for d in agent.stats.recent_disputes}:
                        await trio.sleep(0.05)
                assert not agent.server.admit(TRUSTED.peer_id)  # paused: the answer took over 2 s
                assert agent.refusal(manifest, step, TRUSTED.public_key) is None  # ours failed: it may ask again

    trio.run(main)


class _PartyTracer:
    """The worker's place for a node whose trace of the step is ``party``'s (tests/node/dispute_parties.py)."""

    def __init__(self, party) -> None:
        self.party = party

    async def trace(self, manifest, run_dir, step):
        return StepTrace(self.party.records, self.party.commitment.pre_state, self.party.commitment.post_state)

    async def op_data(self, manifest, run_dir, step, pos):
        return await self.party.op_data(pos)


def test_the_referee_runs_once_on_the_proof_a_nodes_dispute_ends_in(tmp_path, monkeypatch):
    """A forging publisher opens a dispute with an auditor (a real agent on a real host); the
    auditor's bisection ends in a proof that convicts it, which the auditor stores and gossips.
    The referee runs on that proof once, in the bisection: before, the agent judged it again
    before storing it (seconds a proof at ``gpt-1b``)."""
    from open1b.devnet.forged_op import ForgingBackend

    from .dispute_parties import STEP, party

    honest, forger = ident(90), ident(91)
    mine, forged = party(honest), party(forger, ForgingBackend)
    hashes = [blake2b256(b"h", bytes([k])) for k in range(4)]
    hashes[STEP] = mine.commitment.pre_state
    run = run_manifest(forger, engine="test-engine", engine_version="1", model={"d": 1}, data={}, seed=0, steps=3,
                       state_hashes=hashes, created_at=1_800_000_000)
    judged: list[bytes] = []

    def referee(data):
        judged.append(data)
        return verify_fraud_proof(data)

    monkeypatch.setattr(disputes, "verify_fraud_proof", referee)  # the bisection's
    monkeypatch.setattr(fraud_proofs, "verify_fraud_proof", referee)  # the gossip rules'

    async def main():
        with trio.fail_after(120):
            async with open_p2p(honest, "127.0.0.1", 0) as p2p, open_p2p(forger, "127.0.0.1", 0) as opener:
                agent = _agent(tmp_path, run, me=honest, run_dir=tmp_path / "run", p2p=p2p)
                agent.tracer = _PartyTracer(mine)
                agent.store.add_attestation(make_attestation(honest, run, STEP, match=False))
                stored, publish = trio.Event(), agent.publish

                async def published(fraud):
                    try:
                        return await publish(fraud)
                    finally:
                        stored.set()

                agent.publish = published
                async with trio.open_nursery() as nursery:
                    await nursery.start(agent.serve_disputes)
                    await opener.connect(p2p.addrs[0])
                    theirs = TraceCommitment.create(forger, run=run.run_id, step=STEP, pre_state=hashes[STEP],
                                                    post_state=hashes[STEP + 1], ops=forged.commitment.ops,
                                                    root=forged.commitment.root)
                    stream = await opener.open_stream(p2p.peer_id, DISPUTE_PROTOCOL)
                    result = await bisect(stream, Party(theirs, forged.tree, forged.records, forged.op_data))
                    assert result.outcome == "proof"
                    await stored.wait()
                    nursery.cancel_scope.cancel()
                return agent

    agent = trio.run(main)
    [kept] = agent.store.fraud.of_run(run.run_id)
    assert kept.guilty == (forger.public_key,)
    ours = agent.store.fraud.body(run.run_id, kept.digest)
    assert FraudProof.decode(ours).traces[0].tracer == honest.public_key  # our own proof: our trace first
    assert judged.count(ours) == 1
