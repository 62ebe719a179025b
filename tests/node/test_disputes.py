"""The dispute stream /open1b/dispute/1.0.0 (node/disputes.py, docs/protocol.md §18.5) between real
py-libp2p hosts on loopback: a forged op ends in a fraud proof the referee checks, whoever
opened the dispute; a silent peer loses after the round timeout; an oversized or malformed
message ends it with the sender at fault and penalised; a second dispute from one peer is busy."""

import threading
from contextlib import AsyncExitStack

import numpy as np
import pytest
import trio

from open1b.deterministic.backend import cpu_backend
from open1b.devnet.forged_op import ForgingBackend
from open1b.node import disputes
from open1b.node.dispute_exchange import Timing
from open1b.node.disputes import DisputeServer, bisect
from open1b.node.p2p import open_p2p
from open1b.protocol.codec import encode
from open1b.protocol.dispute.bisection import DISPUTE_PROTOCOL, MAX_MESSAGE
from open1b.protocol.dispute.proof import FraudProof
from open1b.protocol.dispute.referee import verify_fraud_proof
from open1b.protocol.dispute.trace import chunk_tree

from .conftest import ident
from .dispute_parties import party

HONEST, FORGER = ident(90), ident(91)


@pytest.fixture(scope="module")
def parties():
    forged = party(FORGER, ForgingBackend)
    return party(HONEST), forged


async def _two_hosts(stack: AsyncExitStack):
    a, b = [await stack.enter_async_context(open_p2p(identity, "127.0.0.1", 0)) for identity in (HONEST, FORGER)]
    await b.connect(a.addrs[0])
    return a, b


class _Served:
    """A DisputeServer on host ``a`` answering with ``party_of_a``, and what it reported."""

    def __init__(self, a, party_of_a) -> None:
        self.penalised, self.results, self.done = [], [], trio.Event()
        async def find(trace, session):
            return party_of_a

        self.server = DisputeServer(find, penalise=self.penalised.append, on_result=self._result)
        self.server.serve(a)

    def _result(self, peer, result) -> None:
        self.results.append((peer, result))
        self.done.set()


@pytest.mark.parametrize("opener", ["honest", "forger"])
def test_a_forged_op_ends_in_a_proof_that_convicts_the_forger_whoever_opens(parties, opener):
    honest, forged = parties
    forged_pos = next(i for i, (x, y) in enumerate(zip(honest.records, forged.records)) if x != y)
    assert honest.records[forged_pos]["kind"] == "gelu"

    async def main():
        with trio.fail_after(120):
            async with AsyncExitStack() as stack:
                a, b = await _two_hosts(stack)  # a: the honest party's host, b: the forger's
                server_party, opener_party = (forged, honest) if opener == "honest" else (honest, forged)
                server_host, opener_host = (b, a) if opener == "honest" else (a, b)
                served = _Served(server_host, server_party)
                stream = await opener_host.open_stream(server_host.peer_id, DISPUTE_PROTOCOL)
                result = await bisect(stream, opener_party)
                await served.done.wait()  # the server's result lands after its last send
                return result, served.results[0][1]

    result, answered = trio.run(main)
    for side in (result, answered):
        assert side.outcome == "proof" and side.position == forged_pos
        verdict = verify_fraud_proof(side.proof)  # the proof stands alone
        assert verdict.accepted and verdict.guilty == (FORGER.public_key,) and verdict.op == "gelu"
        assert verdict.position == forged_pos
    assert result.peer_at_fault == (opener == "honest")
    # ⌈log2 ops⌉ rounds down the trace tree at most, then the output's chunk tree (one chunk here)
    assert 0 < result.rounds <= (len(honest.records) - 1).bit_length()


def test_the_bisections_referee_runs_while_the_event_loop_runs_on(parties, monkeypatch):
    """Each party checks the proof it built (up to seconds at the referee's bound) in a worker
    thread: a referee that first hands the event loop a task, and waits until that task ran,
    meets it (on the event loop it could not, and would wait out its deadline)."""
    honest, forged = parties
    met: list[bool] = []

    async def main():
        token = trio.lowlevel.current_trio_token()
        entered, ran = trio.Event(), threading.Event()

        def referee(data):
            token.run_sync_soon(entered.set)
            met.append(ran.wait(timeout=20))  # a deadlock's bound only
            return verify_fraud_proof(data)

        async def other_task():
            await entered.wait()
            ran.set()

        monkeypatch.setattr(disputes, "verify_fraud_proof", referee)
        with trio.fail_after(120):
            async with AsyncExitStack() as stack:
                a, b = await _two_hosts(stack)
                served = _Served(b, forged)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(other_task)
                    result = await bisect(await a.open_stream(b.peer_id, DISPUTE_PROTOCOL), honest)
                await served.done.wait()
        return result

    assert trio.run(main).outcome == "proof"
    assert met == [True, True]  # both parties' checks


class _UpdateForger:
    """The serial CPU backend, except that the update's new value of the last parameter has one
    bit flipped: a forged op whose outputs are chunked as the state tree is (§18.1, r20)."""

    fused = False

    def __init__(self) -> None:
        self._inner = cpu_backend(False)

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def adamw_all(self, params, grads, m, v, scalars, clip):
        updated = self._inner.adamw_all(params, grads, m, v, scalars, clip)
        name = list(params)[-1]
        forged = updated[0][name].copy()  # the kernel's output is read-only
        forged.reshape(-1).view(np.uint32)[3] ^= np.uint32(1 << 16)
        updated[0][name] = forged
        return updated


def test_a_forged_update_is_bisected_into_its_state_chunks_and_convicted(parties):
    honest, _ = parties
    forged = party(FORGER, _UpdateForger)
    forged_pos = next(i for i, (x, y) in enumerate(zip(honest.records, forged.records)) if x != y)
    assert honest.records[forged_pos]["kind"] == "adamw"

    async def main():
        with trio.fail_after(120):
            async with AsyncExitStack() as stack:
                a, b = await _two_hosts(stack)
                served = _Served(b, forged)
                result = await bisect(await a.open_stream(b.peer_id, DISPUTE_PROTOCOL), honest)
                await served.done.wait()
                return result, served.results[0][1]

    result, answered = trio.run(main)
    for side in (result, answered):
        assert side.outcome == "proof" and side.position == forged_pos
        verdict = verify_fraud_proof(side.proof)
        assert verdict.accepted and verdict.guilty == (FORGER.public_key,) and verdict.op == "adamw"
        # the claimed chunk is the state tree's: its digest opens the record's root as a state chunk
        proof = FraudProof.decode(side.proof)
        record = proof.records[0]["outputs"][proof.output]
        assert chunk_tree(proof.claimed[0].data, state=True).root == record["root"]


def test_equal_traces_agree_in_one_exchange(parties):
    honest, _ = parties

    async def main():
        with trio.fail_after(60):
            async with AsyncExitStack() as stack:
                a, b = await _two_hosts(stack)
                twin = party(FORGER)  # an honest replay under the other key
                _Served(b, twin)
                return await bisect(await a.open_stream(b.peer_id, DISPUTE_PROTOCOL), honest)

    result = trio.run(main)
    assert (result.outcome, result.rounds, result.peer_at_fault) == ("agree", 0, False)


def test_a_peer_that_goes_silent_mid_bisection_loses(parties):
    honest, forged = parties

    async def main():
        with trio.fail_after(60):
            async with AsyncExitStack() as stack:
                a, b = await _two_hosts(stack)
                gone = trio.Event()

                async def silent(stream):  # answers the trace, then nothing
                    await stream.receive(MAX_MESSAGE)
                    await stream.send(encode({"t": "trace", "trace": forged.commitment.encoded}))
                    await stream.receive(MAX_MESSAGE)  # the first round
                    await gone.wait()

                b.set_stream_handler(DISPUTE_PROTOCOL, silent)
                result = await bisect(await a.open_stream(b.peer_id, DISPUTE_PROTOCOL), honest,
                                      timing=Timing(round_timeout_s=1.0))
                gone.set()
                return result

    result = trio.run(main)
    assert (result.outcome, result.peer_at_fault, result.proof) == ("peer_silent", True, None)


@pytest.mark.parametrize("frame", ["oversized", "malformed", "inconsistent"])
def test_a_bad_message_ends_the_dispute_and_its_sender_is_penalised(parties, frame):
    honest, forged = parties

    async def main():
        with trio.fail_after(60):
            async with AsyncExitStack() as stack:
                a, b = await _two_hosts(stack)
                server = _Served(a, honest)
                stream = await b.open_stream(a.peer_id, DISPUTE_PROTOCOL)
                if frame == "oversized":
                    await stream.send(b"\x00" * (MAX_MESSAGE + 1))
                elif frame == "malformed":
                    await stream.send(encode({"t": "trace", "trace": b"not a trace"}))
                else:  # a round whose children do not hash to the root its trace committed
                    await stream.send(encode({"t": "trace", "trace": forged.commitment.encoded}))
                    await stream.receive(MAX_MESSAGE)
                    await stream.send(encode({"t": "children", "left": b"\x01" * 32, "right": b"\x02" * 32}))
                await server.done.wait()
                return server

    server = trio.run(main)
    assert [(peer, r.outcome, r.peer_at_fault) for peer, r in server.results] == [(FORGER.peer_id, "peer_malformed",
                                                                                    True)]
    assert server.penalised == [FORGER.peer_id]


def test_a_second_dispute_from_one_peer_is_busy(parties):
    honest, forged = parties

    async def main():
        with trio.fail_after(60):
            async with AsyncExitStack() as stack:
                a, b = await _two_hosts(stack)
                served = _Served(a, honest)
                first = await b.open_stream(a.peer_id, DISPUTE_PROTOCOL)
                await first.send(encode({"t": "trace", "trace": forged.commitment.encoded}))
                await first.receive(MAX_MESSAGE)  # the server's trace: the first session is on
                second = await b.open_stream(a.peer_id, DISPUTE_PROTOCOL)
                result = await bisect(second, forged)
                assert set(served.server.active) == {FORGER.peer_id}
                return result

    result = trio.run(main)
    assert (result.outcome, result.code, result.peer_at_fault) == ("peer_refused", "busy", False)


def test_the_forging_backend_forges_a_plain_step_as_the_devnet_trainer_runs_it():
    # The forged-op trainer trains without a trace; had the forged op run inside a fused product's
    # epilogue, it would never be called and the trainer's witness would be the honest one.
    from open1b.deterministic import train_step
    from open1b.deterministic.backend import cpu_backend

    from .dispute_parties import PRESET, step_inputs

    state, batch = step_inputs()
    forging = ForgingBackend()
    _, honest = train_step(state, batch, PRESET.topology, backend=cpu_backend(False))
    _, forged = train_step(state, batch, PRESET.topology, backend=forging)
    assert forging.calls > forging.nth and forged.witness != honest.witness
