"""Fraud proofs over the gossip bound (docs/protocol.md §18.7): gossiped as a reference
(node/fraud_proof_refs.py), the body fetched by digest from the peer that announced it
(node/fraud_proof_fetch.py), judged as a gossiped proof, stored, and announced again only then.
The proof here is a real one of 1.1 MB: a `sum_rows` whose disputed column reads all of a
(1100, 256) input, as a `small` step's sums and products do (§18.6)."""

from __future__ import annotations

import dataclasses
import io
import random
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Iterable

import numpy as np
import pytest
import trio

from open1b.deterministic import reduction
from open1b.node.clock import Clock
from open1b.node.fraud_proof_fetch import FRAUD_PROOF_PROTOCOL, ProofFetcher, fetch_fraud_proof
from open1b.node.fraud_proof_refs import MAX_FRAUD_PROOF_REF, FraudProofRef, judge_fraud_proof_ref
from open1b.node.fraud_proofs import MAX_GOSSIP_FRAUD_PROOF, Bearing, judge_fraud_proof
from open1b.node.topics import fraud_proof_refs_topic, fraud_proofs_topic
from open1b.protocol import Outcome
from open1b.protocol.codec import encode
from open1b.protocol.dispute import MAX_FRAUD_PROOF_SIZE
from open1b.protocol.errors import InvalidStatementError, ProtocolError
from open1b.protocol.hashing import blake2b256
from tests.protocol.conftest import make_attestation
from tests.protocol.dispute_cases import traces_around
from tests.runs import run_manifest

from .conftest import ident
from .fakes import FakeGossip, make_ledger
from .test_fraud_proofs import MANIFEST as SMALL_MANIFEST
from .test_fraud_proofs import proof as small_proof

T0 = 1_800_000_000
STEP = 3
PUBLISHER, AUDITOR, OTHER = ident(0), ident(1), ident(2)


def _sum_rows_case():
    x = np.random.default_rng(11).standard_normal((1100, 256)).astype(np.float32)
    return [x], {}, [reduction.KERNELS[False][0](x)]


CASE = _sum_rows_case()


def _states() -> tuple[bytes, bytes]:
    """h_3 of the traces, and the forger's post_state (functions of the op, not of the run or the
    signers): the run publishes the forger's state as h_4, so a proof convicting the publisher
    refutes step 3."""
    traces = traces_around("sum_rows", *CASE, (OTHER, PUBLISHER)).traces
    return traces[0].pre_state, traces[1].post_state


STATES = dict(zip((STEP, STEP + 1), _states()))
MANIFEST = run_manifest(PUBLISHER, engine="test-engine", engine_version="1", model={"d": 2}, data={}, seed=0,
                        steps=5, state_hashes=[STATES.get(k, blake2b256(b"h", bytes([k]))) for k in range(6)],
                        created_at=T0 - 100)


def big_proof(honest, liar, *, forged: bool = False) -> bytes:
    """A proof of MANIFEST's step 3 convicting ``liar``; ``forged``: one bit of an input chunk
    flipped, which the referee refuses."""
    p = traces_around("sum_rows", *CASE, (honest, liar), run=MANIFEST.run_id, step=STEP)
    if forged:
        first = p.reads[0][0]
        flipped = dataclasses.replace(first, data=bytes([first.data[0] ^ 1]) + first.data[1:])
        p = dataclasses.replace(p, reads=((flipped, *p.reads[0][1:]), *p.reads[1:]))
    return p.encode()


BIG = big_proof(AUDITOR, PUBLISHER)


def _ledger(directory, gossip=None, identity=OTHER):
    ledger = make_ledger(directory, MANIFEST, identity=identity, clock=Clock(wall_at_zero=T0), gossip=gossip)
    trio.run(ledger.statements.join_known_runs)
    return ledger


def _fraud(ledger, data=BIG):
    verdict = judge_fraud_proof(data, ledger.statements.bearing, max_size=MAX_FRAUD_PROOF_SIZE)
    assert verdict.accepted, verdict.reason
    return verdict.message


def test_the_proof_is_over_the_gossip_bound_and_a_reference_names_it():
    assert MAX_GOSSIP_FRAUD_PROOF < len(BIG) < 2 * MAX_GOSSIP_FRAUD_PROOF
    ref = FraudProofRef.decode(FraudProofRef(MANIFEST.run_id, STEP, blake2b256(BIG), len(BIG),
                                             (PUBLISHER.public_key,)).encoded)
    assert len(ref.encoded) <= MAX_FRAUD_PROOF_REF
    assert len(FraudProofRef(b"\1" * 32, 2**64 - 1, b"\2" * 32, 2**64 - 1, (b"\3" * 32, b"\4" * 32)).encoded) \
        <= MAX_FRAUD_PROOF_REF  # the largest reference fits its bound


class _Gossip(FakeGossip):
    """FakeGossip with what the proof fetcher needs besides: its peer ID and a stream handler."""

    peer_id = "me"

    def set_stream_handler(self, protocol, handler) -> None:
        self.handler = handler


def test_a_reference_passes_its_rules_in_order_and_a_good_one_is_wanted_not_forwarded(tmp_path):
    gossip = _Gossip()
    ledger = _ledger(tmp_path, gossip)
    validate = gossip.validators[fraud_proof_refs_topic(MANIFEST.run_id)]
    assert validate("peer", b"\xa0") is Outcome.IGNORE  # no fetcher: references are not taken
    fetcher = ProofFetcher(gossip, ledger.statements, ledger.outbox.regossip, tmp_path / "spool")
    assert ledger.statements.proof_refs is fetcher
    wanted = []
    fetcher.want = lambda ref, peer: wanted.append((ref, peer))
    good = FraudProofRef(MANIFEST.run_id, STEP, blake2b256(BIG), len(BIG), (PUBLISHER.public_key,))
    fields = {"kind": "fraud_proof_ref", "v": 1, "run": MANIFEST.run_id, "step": STEP, "digest": good.digest,
              "size": good.size, "guilty": [PUBLISHER.public_key]}

    def ref(**changes) -> bytes:
        return encode({**fields, **changes})

    cases = [
        (b"\x00" * (MAX_FRAUD_PROOF_REF + 1), Outcome.REJECT, "oversize"),
        (b"\xa0", Outcome.REJECT, "kind"),
        (ref(v=2), Outcome.REJECT, "version"),
        (ref(extra=1), Outcome.REJECT, "unknown_field"),
        (ref(guilty=[]), Outcome.REJECT, "wrong_type"),
        (ref(guilty=[b"\2" * 32, b"\1" * 32]), Outcome.REJECT, "wrong_type"),  # not ascending: two encodings
        (ref(size=MAX_GOSSIP_FRAUD_PROOF), Outcome.REJECT, "ref_size"),  # it fits a gossip message: sent whole
        (ref(size=MAX_FRAUD_PROOF_SIZE + 1), Outcome.REJECT, "ref_size"),
        (ref(run=b"\x22" * 32), Outcome.IGNORE, "unknown_run"),
        (ref(step=5), Outcome.REJECT, "step_range"),
        (ref(guilty=[AUDITOR.public_key]), Outcome.IGNORE, "not_attested"),
    ]
    for data, outcome, code in cases:
        before = ledger.statements.validation.copy()
        assert validate("peer", data) is outcome, code
        before.update([f"fraud_proof_ref/{outcome.value}/{code}"])
        assert ledger.statements.validation == before, code
    assert wanted == []
    # a good one is wanted from its author, and ignored by the router: forwarded only by a node
    # that fetched and judged the body, as a reference of its own
    assert validate("peer", good.encoded) is Outcome.IGNORE
    assert wanted == [(good, "peer")]
    assert validate("me", good.encoded) is Outcome.ACCEPT  # our own, published
    # from sync: wanted from the peer that served it; a refused one counted, a REJECT held against it
    fetcher.synced(good.encoded, "syncer")
    fetcher.synced(ref(step=5), "syncer")
    assert wanted[-1] == (good, "syncer") and gossip.penalised == ["syncer"]
    assert ledger.statements.validation["sync/reject/step_range"] == 1
    # once the proof (or a lower digest of its conviction) is stored, a reference adds nothing
    assert ledger.statements.add_own(_fraud(ledger))
    assert validate("other", good.encoded) is Outcome.IGNORE
    assert ledger.statements.validation["fraud_proof_ref/ignore/held"] == 1 and len(wanted) == 2
    # the rules are the module's, given lookups
    bearing = Bearing({MANIFEST.run_id: MANIFEST}.get, lambda *a: False, lambda k: False, lambda *a: False, lambda *a: False,
                      lambda r: True)
    assert judge_fraud_proof_ref(good.encoded, bearing).message == good
    # a key that attested the step but does not count here (r25), and a run whose bound is reached
    ledger.statements.ingest_attestation(make_attestation(AUDITOR, MANIFEST, STEP, match=False).encoded)
    assert validate("peer", ref(guilty=[AUDITOR.public_key])) is Outcome.IGNORE
    assert ledger.statements.validation["fraud_proof_ref/ignore/not_counted"] == 1
    full = dataclasses.replace(bearing, fits=lambda r: False)
    assert judge_fraud_proof_ref(good.encoded, full).code == "run_full"


@asynccontextmanager
async def _body_server(bodies: Iterable[bytes], requests: list[bytes] | None = None):
    """Two real libp2p hosts: a server that answers each fetch of a proof body with the next of
    ``bodies`` (each request kept in ``requests``), and a client, ``ident(51)``, connected to it.
    Yields (the client, the server's peer id)."""
    from open1b.node.p2p import open_p2p

    answers = iter(bodies)

    async def serve(stream):
        request = await stream.receive(128)
        if requests is not None:
            requests.append(request)
        await stream.send(next(answers))
        await stream.close()

    async with open_p2p(ident(50), "127.0.0.1", 0) as server, open_p2p(ident(51), "127.0.0.1", 0) as client:
        server.set_stream_handler(FRAUD_PROOF_PROTOCOL, serve)
        yield client, await client.connect(server.addrs[0])


def test_a_fetched_body_is_judged_as_gossip_and_must_convict_whom_its_reference_says(tmp_path):
    """Real libp2p hosts: a server answers each fetch with the next body; the fetcher judges
    each, penalises the provably bad, stores the good one."""
    forged = big_proof(AUDITOR, PUBLISHER, forged=True)
    good = FraudProofRef(MANIFEST.run_id, STEP, blake2b256(BIG), len(BIG), (PUBLISHER.public_key,))
    cases = [  # (reference, body served, the fetch's outcome, the refusal counted)
        (dataclasses.replace(good, guilty=tuple(sorted((PUBLISHER.public_key, AUDITOR.public_key)))), BIG,
         "refused", "fraud_proof/reject/ref_mismatch"),  # the bytes say something else than announced
        (dataclasses.replace(good, digest=blake2b256(forged), size=len(forged)), forged,
         "refused", "fraud_proof/reject/reads"),  # the referee refuses it
        (good, BIG[:-1] + b"\0", "rejected", "fraud_proof_ref/reject/ref_body"),  # not the bytes announced
        (good, BIG + b"\0", "rejected", "fraud_proof_ref/reject/ref_body"),  # a frame over the size announced
        (good, b"", "empty", None),  # it keeps none: nothing proven
        (good, BIG, "stored", None),
        (good, BIG, "held", None),  # stored already (the fetch is not even tried)
    ]

    async def main():
        with trio.fail_after(60):
            async with _body_server([body for _, body, _, _ in cases]) as (client, peer):
                ledger = make_ledger(tmp_path, MANIFEST, identity=ident(51), clock=Clock(wall_at_zero=T0),
                                     gossip=client)
                regossiped = []

                async def regossip(fraud):
                    regossiped.append(fraud)

                fetcher = ProofFetcher(client, ledger.statements, regossip, tmp_path / "spool")
                for ref, _, outcome, counted in cases:
                    before, counts = fetcher.fetched.copy(), ledger.statements.validation.copy()
                    await fetcher.fetch(ref, peer)
                    assert fetcher.fetched - before == {outcome: 1}, outcome
                    counts.update([counted] if counted else [])
                    assert ledger.statements.validation == counts, outcome
                assert client.rejected == {peer: 4}
                assert [f.encoded for f in regossiped] == [BIG]  # announced again once, once stored
        assert [f.digest for f in ledger.store.fraud.of_run(MANIFEST.run_id)] == [blake2b256(BIG)]
        cov = ledger.judge.coverage(MANIFEST.run_id)
        assert cov.refuted_steps == [STEP] and cov.steps[STEP].fraud_proofs == (blake2b256(BIG),)

    trio.run(main)


def test_a_large_proof_is_gossiped_and_synced_as_its_reference(tmp_path):
    gossip = FakeGossip()
    ledger = _ledger(tmp_path, gossip)
    fraud = _fraud(ledger)
    assert trio.run(ledger.outbox.publish, fraud)
    assert gossip.published == [(fraud_proof_refs_topic(MANIFEST.run_id), FraudProofRef.of(fraud).encoded)]
    assert ledger.store.fraud.of_run(MANIFEST.run_id) == [fraud.record]
    assert ledger.store.fraud.body(MANIFEST.run_id, fraud.digest) == BIG
    assert ledger.store.fraud.body(MANIFEST.run_id, b"\0" * 32) is None
    [synced] = [s for s in ledger.statements.statements_for_sync(MANIFEST.run_id) if s.KIND.startswith("fraud")]
    assert synced == FraudProofRef.of(fraud)
    assert fraud_proofs_topic(MANIFEST.run_id) != fraud_proof_refs_topic(MANIFEST.run_id)


async def _line_of_nodes(stack: AsyncExitStack, nursery, tmp_path, names, manifests=(MANIFEST,)):
    """Nodes with real libp2p hosts, each with its ledger (knowing ``manifests``) and proof fetcher
    running, each connected to the one before it only."""
    from open1b.node.p2p import open_p2p

    nodes = []
    for i, name in enumerate(names):
        p2p = await stack.enter_async_context(open_p2p(ident(40 + i), "127.0.0.1", 0, heartbeat_s=0.2))
        ledger = make_ledger(tmp_path / name, *manifests, identity=ident(40 + i), clock=Clock(wall_at_zero=T0),
                             gossip=p2p)
        fetcher = ProofFetcher(p2p, ledger.statements, ledger.outbox.regossip, tmp_path / name / "spool")
        await nursery.start(fetcher.serve_fetcher)
        await ledger.statements.join_known_runs()
        if nodes:
            await p2p.connect(nodes[-1][0].addrs[0])
        nodes.append((p2p, ledger, fetcher))
    return nodes


def _stored_event(ledger) -> trio.Event:
    stored = trio.Event()
    ledger.statements.listeners.append(lambda s: stored.set() if s.KIND == "fraud_proof" else None)
    return stored


def test_a_large_proof_reaches_a_node_two_hops_away_that_never_saw_the_dispute(tmp_path):
    """Three real libp2p hosts in a line, a — b — c: a holds a 1.1 MB proof (a party of the
    dispute) and publishes it; b fetches the body from a, judges it, stores it and announces it
    itself; c, connected to b alone, fetches it from b. c's coverage refutes the step citing it."""
    topic = fraud_proof_refs_topic(MANIFEST.run_id)

    async def main():
        with trio.fail_after(90):
            async with AsyncExitStack() as stack:
                nursery = await stack.enter_async_context(trio.open_nursery())
                (a, la, _), (b, lb, fb), (c, lc, fc) = await _line_of_nodes(stack, nursery, tmp_path, "abc")
                stored_b, stored_c = _stored_event(lb), _stored_event(lc)
                await a.pubsub.wait_for_mesh(b.host.get_id(), topic, timeout=30)
                await b.pubsub.wait_for_mesh(c.host.get_id(), topic, timeout=30)
                assert c.peer_id not in a.connected_peers()  # c hears of it from b alone
                assert await la.outbox.publish(_fraud(la))
                await stored_b.wait()
                await stored_c.wait()
                assert c.peer_id not in a.connected_peers()  # so c fetched the body from b, which announced it
                nursery.cancel_scope.cancel()
        assert (fb.fetched["stored"], fc.fetched["stored"]) == (1, 1)
        for ledger in (lb, lc):
            assert [f.digest for f in ledger.store.fraud.of_run(MANIFEST.run_id)] == [blake2b256(BIG)]
        cov = lc.judge.coverage(MANIFEST.run_id)
        assert cov.refuted_steps == [STEP] and cov.steps[STEP].fraud_proofs == (blake2b256(BIG),)
        assert lc.store.attestations(MANIFEST.run_id) == []  # no attestation, no quorum: the proof alone

    trio.run(main)


def test_a_late_joiner_learns_a_large_proof_through_sync_and_refutes_the_step(tmp_path):
    """A node that joins after the dispute, knowing neither the run nor the proof: it learns the
    manifest (the runs sync), the holder's sync response carries the proof's reference, the joiner
    fetches the body from the holder, and its coverage cites the proof."""
    from open1b.node.sync import Syncer

    async def main():
        with trio.fail_after(60):
            async with AsyncExitStack() as stack:
                nursery = await stack.enter_async_context(trio.open_nursery())
                (holder_p2p, holder, _), = await _line_of_nodes(stack, nursery, tmp_path, ["holder"])
                assert holder.statements.add_own(_fraud(holder))
                (joiner_p2p, joiner, fetcher), = await _line_of_nodes(stack, nursery, tmp_path, ["joiner"], ())
                assert joiner.statements.manifests == {}
                stored = _stored_event(joiner)
                Syncer(holder_p2p, holder.statements, holder.config, clock=holder.statements.clock,
                       rng=random.Random(1), stats=holder.statements.stats)  # its handlers answer
                syncer = Syncer(joiner_p2p, joiner.statements, joiner.config, clock=joiner.statements.clock,
                                rng=random.Random(1), stats=joiner.statements.stats)
                peer = await joiner_p2p.connect(holder_p2p.addrs[0])
                assert await syncer.sync_with(peer) == 1  # the manifest; then a reference: the body comes next
                await stored.wait()
                nursery.cancel_scope.cancel()
        assert fetcher.fetched == {"stored": 1}
        cov = joiner.judge.coverage(MANIFEST.run_id)
        assert cov.refuted_steps == [STEP] and cov.steps[STEP].fraud_proofs == (blake2b256(BIG),)

    trio.run(main)


def test_sync_sends_references_only_to_pullers_that_read_them(tmp_path, monkeypatch):
    """Two real libp2p hosts. A node of r22 or earlier pulls on /open1b/sync/1.0.0 and reads a
    reference as a malformed attestation, which it holds against the server: there the holder
    sends none (the small proof still goes whole). A puller of now asks for 1.1.0 first and gets
    it; from a server that speaks only 1.0.0 (r23, r24: with references) it falls back to that
    and still takes the reference."""
    from open1b.node import sync
    from open1b.node.p2p import open_p2p
    from open1b.node.sync import SYNC_PROTOCOL, SYNC_PROTOCOL_R22, Syncer, pull_attestations, serve_sync

    monkeypatch.setattr(sync, "MIN_SYNC_INTERVAL_S", 0)  # one puller asks for one run several times here
    small = small_proof(AUDITOR, PUBLISHER)

    async def pulled(client, peer, run, *protocols) -> list[bytes]:
        got: list[bytes] = []

        async def ingest(frames):
            got.extend(frames)
            return 0
        if protocols:  # a puller that speaks only these
            stream = await client.open_stream(peer, *protocols)
            await stream.send(encode({"run": run}))
            while frame := await stream.receive(MAX_GOSSIP_FRAUD_PROOF):
                got.append(frame)
            await stream.close()
        else:
            await pull_attestations(client, peer, run, ingest)
        return got

    async def main():
        with trio.fail_after(60):
            async with open_p2p(ident(5), "127.0.0.1", 0) as server, open_p2p(ident(6), "127.0.0.1", 0) as client, \
                    open_p2p(ident(7), "127.0.0.1", 0) as old_server:
                holder = make_ledger(tmp_path / "holder", MANIFEST, SMALL_MANIFEST, clock=Clock(wall_at_zero=T0),
                                     gossip=server)
                big = _fraud(holder)
                assert holder.statements.add_own(big)
                assert holder.statements.add_own(judge_fraud_proof(small, holder.statements.bearing).message)
                Syncer(server, holder.statements, holder.config, clock=holder.statements.clock,
                       rng=random.Random(1), stats=holder.statements.stats)
                old_server.set_stream_handler(SYNC_PROTOCOL_R22, lambda stream: serve_sync(
                    stream, holder.statements.statements_for_sync))
                ref = FraudProofRef.of(big).encoded
                peer = await client.connect(server.addrs[0])
                assert await pulled(client, peer, MANIFEST.run_id, SYNC_PROTOCOL_R22) == []
                assert await pulled(client, peer, SMALL_MANIFEST.run_id, SYNC_PROTOCOL_R22) == [small]
                assert await pulled(client, peer, MANIFEST.run_id, SYNC_PROTOCOL) == [ref]
                assert await pulled(client, peer, MANIFEST.run_id) == [ref]
                old = await client.connect(old_server.addrs[0])
                assert await pulled(client, old, MANIFEST.run_id) == [ref]

    trio.run(main)


def test_fetch_reads_no_more_than_announced_and_takes_only_the_bytes_named(tmp_path):
    ref = FraudProofRef(MANIFEST.run_id, STEP, blake2b256(BIG), len(BIG), (PUBLISHER.public_key,))
    requests = []

    async def main():
        with trio.fail_after(60):
            async with _body_server([BIG[:-1] + b"\0", BIG + b"\0", b"", BIG], requests) as (client, peer):
                for written in (len(BIG), 0):  # the same size, another digest; one byte over the size (unread)
                    spool = io.BytesIO()
                    with pytest.raises(InvalidStatementError) as raised:
                        await fetch_fraud_proof(client, peer, ref, spool)
                    assert raised.value.code == "ref_body" and len(spool.getvalue()) == written
                spool = io.BytesIO()
                assert await fetch_fraud_proof(client, peer, ref, spool) is False and spool.getvalue() == b""
                assert await fetch_fraud_proof(client, peer, ref, spool) is True and spool.getvalue() == BIG
        assert requests == [encode({"run": MANIFEST.run_id, "digest": ref.digest})] * 4

    trio.run(main)


def test_a_node_serves_the_bodies_it_keeps_by_digest_one_stream_per_peer(tmp_path):
    from open1b.node.fraud_proof_fetch import serve_fraud_proof

    class Stream:
        peer_id = "p"

        def __init__(self, request):
            self.request, self.sent, self.was_reset = request, [], False

        async def receive(self, max_size):
            assert max_size == 128
            return self.request

        async def send(self, frame):
            self.sent.append(frame)

        async def send_pieces(self, body):
            self.sent.append(body.read(0, body.nbytes))

        async def close(self):
            pass

        async def reset(self):
            self.was_reset = True

    ledger = _ledger(tmp_path)
    assert ledger.statements.add_own(_fraud(ledger))
    body = ledger.store.fraud.open_body

    async def main():
        for digest, expected in ((blake2b256(BIG), BIG), (b"\0" * 32, b"")):
            stream = Stream(encode({"run": MANIFEST.run_id, "digest": digest}))
            await serve_fraud_proof(stream, body)
            assert stream.sent == [expected]
        with pytest.raises(ProtocolError):
            await serve_fraud_proof(Stream(encode({"run": MANIFEST.run_id})), body)
        fetcher = ProofFetcher(_Gossip(), ledger.statements, ledger.outbox.regossip, tmp_path / "spool")
        fetcher._serving.add("p")  # a stream of that peer's is being answered
        busy = Stream(encode({"run": MANIFEST.run_id, "digest": blake2b256(BIG)}))
        await fetcher.p2p.handler(busy)
        assert busy.was_reset and busy.sent == []

    trio.run(main)


def test_the_wanted_queue_is_bounded_per_peer_and_by_digest(tmp_path):
    from open1b.node.fraud_proof_fetch import MAX_WANTED_PER_PEER

    ledger = _ledger(tmp_path)
    fetcher = ProofFetcher(_Gossip(), ledger.statements, ledger.outbox.regossip, tmp_path / "spool")
    refs = [FraudProofRef(MANIFEST.run_id, STEP, bytes([i]) * 32, len(BIG), (PUBLISHER.public_key,))
            for i in range(MAX_WANTED_PER_PEER + 1)]
    for r in refs:
        fetcher.want(r, "p")
    fetcher.want(refs[0], "q")  # one fetch per digest
    fetcher.want(refs[-1], "q")
    assert fetcher._per_peer == {"p": MAX_WANTED_PER_PEER, "q": 1}
    assert len(fetcher._wanted) == MAX_WANTED_PER_PEER + 1
