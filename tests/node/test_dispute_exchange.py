"""A dispute's time bounds (node/dispute_exchange.py, docs/protocol.md §18.5, r28) between real
py-libp2p hosts on loopback, on the node's injected clock (moved on by the test, never slept):
a peer that walks its rounds just inside the round timeout loses once its rounds' budget is spent;
a peer as slow as the spec allows each part (a traced replay, a round at the pace) is never cut
off; and peers that walk slowly cannot hold every answer slot."""

import functools
from contextlib import AsyncExitStack

import cbor2
import pytest
import trio
import trio.testing

from open1b.devnet.forged_op import ForgingBackend
from open1b.node.clock import Clock
from open1b.node.disputes import DisputeServer, Party, bisect
from open1b.node.p2p import open_p2p
from open1b.protocol.codec import encode
from open1b.protocol.dispute.bisection import (
    DISPUTE_PROTOCOL,
    MAX_MESSAGE,
    ROUND_PACE_S,
    ROUND_TIMEOUT_S,
    TRACE_TIMEOUT_S,
    Descent,
    rounds_budget,
)
from open1b.protocol.dispute.trace import TraceCommitment

from .conftest import ident
from .dispute_parties import party

HONEST, FORGER = ident(92), ident(93)
COLLUDERS, LATECOMER = [ident(94 + i) for i in range(4)], ident(98)


@pytest.fixture(scope="module")
def parties():
    return party(HONEST), party(FORGER, ForgingBackend)


class _Clock(Clock):
    """The node's clock: trio's, plus what the test moved it on by."""

    def __init__(self) -> None:
        super().__init__()
        self.offset = 0.0

    def now(self) -> float:
        return trio.current_time() + self.offset


class _Slow:
    """A stream whose owner takes ``compute`` seconds of ``clock`` before its trace and before its
    first message after the records (its traced replays), and ``per_round`` before every other."""

    def __init__(self, stream, clock: _Clock, *, per_round: float, compute: float) -> None:
        self.stream, self.clock, self.per_round, self.compute = stream, clock, per_round, compute
        self.peer_id, self.last = stream.peer_id, None

    async def send(self, frame: bytes) -> None:
        kind = cbor2.loads(frame)["t"]
        self.clock.offset += self.compute if kind == "trace" or self.last == "record" else self.per_round
        self.last = kind
        await self.stream.send(frame)

    def __getattr__(self, name):
        return getattr(self.stream, name)


def _signed_by(identity, other: Party) -> Party:
    """``other``'s trace, signed by ``identity`` (a colluder need not compute a step to disagree)."""
    c = other.commitment
    commitment = TraceCommitment.create(identity, run=c.run, step=c.step, pre_state=c.pre_state,
                                        post_state=c.post_state, ops=c.ops, root=c.root)
    return Party(commitment, other.tree, other.records, other.op_data)


async def _dispute_with_slow_forger(parties, *, per_round: float, compute: float):
    clock = _Clock()
    with trio.fail_after(60):
        return await _forger_on(parties, clock, per_round=per_round, compute=compute)


async def _forger_on(parties, clock: _Clock, *, per_round: float, compute: float):
    honest, forged = parties
    async with AsyncExitStack() as stack:
        a, b = [await stack.enter_async_context(open_p2p(i, "127.0.0.1", 0)) for i in (HONEST, FORGER)]
        await b.connect(a.addrs[0])
        server = DisputeServer(lambda theirs, session: _ready(forged), penalise=lambda peer: None,
                               on_result=lambda peer, result: None, clock=clock)
        b.set_stream_handler(DISPUTE_PROTOCOL,
                             lambda s: server.handle(_Slow(s, clock, per_round=per_round, compute=compute)))
        result = await bisect(await a.open_stream(b.peer_id, DISPUTE_PROTOCOL), honest, clock=clock)
        return result, clock.offset


async def _ready(value):
    return value


def test_a_peer_that_walks_its_rounds_just_inside_the_timeout_loses_when_its_budget_is_spent(parties):
    honest, _ = parties
    walk = ROUND_TIMEOUT_S - 1
    budget = rounds_budget(honest.commitment.ops)  # 60 s + 5 s for each of ⌈log2 ops⌉ + 20 exchanges
    result, moved = trio.run(functools.partial(_dispute_with_slow_forger, parties, per_round=walk, compute=walk))
    # every round was inside its timeout, and the round that took the peer over its budget ended it
    lost_at = int(budget // walk) + 1
    assert (result.outcome, result.peer_at_fault, result.proof) == ("peer_silent", True, None)
    assert result.rounds == lost_at and moved == walk * (1 + lost_at)
    assert lost_at < (honest.commitment.ops - 1).bit_length()  # far from the end of the descent


def test_a_peer_as_slow_as_the_spec_allows_is_never_cut_off(parties):
    # Each traced replay just inside TRACE_TIMEOUT_S, every other message at the pace: 2 hours of
    # replays and a round every 5 s end in the proof, as at full speed.
    result, moved = trio.run(functools.partial(_dispute_with_slow_forger, parties, per_round=ROUND_PACE_S,
                                               compute=TRACE_TIMEOUT_S - 1))
    assert (result.outcome, result.peer_at_fault) == ("proof", True)
    assert moved > 2 * (TRACE_TIMEOUT_S - 1)


def test_peers_that_walk_slowly_cannot_hold_every_answer_slot(parties):
    honest, forged = parties
    clock = _Clock()

    async def main():
        with trio.fail_after(60):
            return await walk()

    async def walk():
        async with AsyncExitStack() as stack:
            hosts = [await stack.enter_async_context(open_p2p(i, "127.0.0.1", 0))
                     for i in (HONEST, *COLLUDERS, LATECOMER)]
            server_host, latecomer = hosts[0], hosts[5]
            results, answered_latecomer = [], trio.Event()

            def on_result(peer, result):
                results.append((peer, result.outcome))
                if peer == LATECOMER.peer_id:
                    answered_latecomer.set()

            server = DisputeServer(lambda theirs, session: _ready(honest), penalise=lambda peer: None,
                                   on_result=on_result, clock=clock)
            server.serve(server_host)
            walks = []  # each colluder's stream and its descent against the server's trace
            for host, identity in zip(hosts[1:5], COLLUDERS):
                await host.connect(server_host.addrs[0])
                stream = await host.open_stream(server_host.peer_id, DISPUTE_PROTOCOL)
                await stream.send(encode({"t": "trace", "trace": _signed_by(identity, forged).commitment.encoded}))
                await stream.receive(MAX_MESSAGE)
                walks.append((stream, Descent(forged.tree, honest.commitment.root)))
            clock.offset += ROUND_TIMEOUT_S - 1  # each answers its first round 59 s in: inside the timeout
            assert all(e.behind() < 0 for e in server.active.values())  # the slack is one round timeout
            for stream, descent in walks:
                left, right = descent.children()
                await stream.send(encode({"t": "children", "left": left, "right": right}))
                reply = cbor2.loads(await stream.receive(MAX_MESSAGE))
                descent.step(reply["left"], reply["right"])
            await trio.testing.wait_all_tasks_blocked(0.05)  # the server waits on each one's second round
            clock.offset += ROUND_TIMEOUT_S - 1  # 59 s into it: 118 s, where three waits' pace and the slack allow 75
            assert len(server.active) == 4 and all(e.behind() > 0 for e in server.active.values())
            await latecomer.connect(server_host.addrs[0])
            stream = await latecomer.open_stream(server_host.peer_id, DISPUTE_PROTOCOL)
            result = await bisect(stream, _signed_by(LATECOMER, forged), clock=clock)
            if result.outcome != "peer_refused":  # busy: what it was before the slots could change hands
                await answered_latecomer.wait()
            return result, list(results)

    result, results = trio.run(main)
    assert result.outcome == "proof"  # answered in full, not busy
    assert results[0][1] == "peer_silent" and results[0][0] in {c.peer_id for c in COLLUDERS}
    assert results[1:] == [(LATECOMER.peer_id, "proof")]
