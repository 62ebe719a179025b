"""The dispute stream ``/open1b/dispute/1.0.0`` (docs/protocol.md §18.5): two parties that reached
different h_{k+1} from the same h_k bisect their op traces to the first op at which they part,
then that op's output to the first chunk, and the one that found it builds the fraud proof.

The opener runs :func:`bisect`, the other end :func:`answer` (:class:`DisputeServer` serves it);
the opener sends first in every exchange.

1. ``trace``: each party's signed trace commitment (signed by the stream's peer; the same run,
   step, pre_state and op count). Equal roots end it: ``agree``.
2. ``children`` rounds down the trace tree (:class:`.bisection.Descent`) to the first differing
   op, then ``record``: each its record there, checked against the leaf it revealed.
3. Records that differ in kind, attributes or inputs end it as ``records_differ``: the peer's
   record contradicts the op order or the earlier outputs both traces share — this node's own
   finding (no referee judges link proofs yet, §18.8).
4. Otherwise ``children`` rounds down the first differing output's chunk tree, then ``chunk``:
   each its bytes of the chunk found. The node builds the proof (§18.3) and runs the referee on
   it: ``proof``, with the verdict.

Every message is read with its type's bound (:mod:`open1b.protocol.dispute.bisection`); a frame
over it, a malformed or inconsistent message (children that do not hash to the node revealed
before, a record or chunk that is not the leaf revealed) ends the dispute with the peer at fault
(``peer_malformed``, penalised by the caller); a peer that does not answer an exchange in time
(:mod:`.dispute_exchange`: each exchange's timeout, the rounds' budget, r28) loses it
(``peer_silent``: this node's finding, as silence proves nothing to others).
"""

from __future__ import annotations

import logging
from contextlib import AsyncExitStack
from dataclasses import dataclass
from functools import partial
from typing import Awaitable, Callable, Sequence

import trio

from open1b.protocol.codec import encode
from open1b.protocol.dispute.bisection import DISPUTE_PROTOCOL, Descent
from open1b.protocol.dispute.proof import Opening, check_record, fraud_proof_at
from open1b.protocol.dispute.referee import FraudVerdict, verify_fraud_proof
from open1b.protocol.dispute.trace import (
    TraceCommitment,
    chunk_digest,
    chunk_reader,
    chunk_size,
    chunk_tree,
    op_leaf,
    state_output,
)
from open1b.protocol.errors import ProtocolError
from open1b.protocol.identity import public_key_from_peer_id
from open1b.protocol.merkle import MerkleTree, leaf_hash

from .clock import Clock
from .dispute_exchange import Exchange, PeerFault, Timing
from .op_data import OpData
from .p2p import NetworkError, Stream

log = logging.getLogger("open1b.node.disputes")

OpDataOf = Callable[[int], Awaitable[OpData]]
"""``op_data(pos)``: op ``pos``'s input bytes (with tensor proofs for state inputs) and output
bytes, as this party computed them (a replay to that op with ``OpTrace(keep={pos})``), until the
dispute closes it."""


@dataclass(frozen=True)
class Party:
    """One side of a dispute over a step: its signed trace commitment, trace tree and records,
    and how to get the data of one op."""

    commitment: TraceCommitment
    tree: MerkleTree
    records: Sequence[dict]
    op_data: OpDataOf


@dataclass(frozen=True)
class DisputeResult:
    """How a bisection ended. ``outcome``: ``agree``, ``proof`` (``proof`` and ``verdict`` set:
    the referee's verdict on exactly those bytes, which the node carries to its store rather than
    judge the proof again, node/dispute_agent.py),
    ``records_differ``, ``ops_differ``, ``peer_silent``, ``peer_malformed``, ``peer_refused``
    (it answered an ``error``: ``code``); answering, ``no_trace`` (this node had none of the peer's
    step) or ``not_disputed`` (nothing it counts warrants it). ``peer_at_fault``: this node's finding against the peer
    (a proof's verdict is the referee's, which anyone can check)."""

    outcome: str
    rounds: int = 0
    position: int | None = None
    proof: bytes | None = None
    verdict: FraudVerdict | None = None
    code: str | None = None
    peer_at_fault: bool = False


def _their_trace(exchange: Exchange, message: dict) -> TraceCommitment:
    try:
        theirs = TraceCommitment.decode(message["trace"])
    except ProtocolError as exc:
        raise PeerFault("peer_malformed", f"its trace: {exc}") from exc
    # [REJECT] the trace is signed by the peer at the other end
    if theirs.tracer != public_key_from_peer_id(exchange.stream.peer_id):
        raise PeerFault("peer_malformed", "its trace is signed by another key")
    return theirs


async def _ended(exchange: Exchange, run) -> DisputeResult:
    try:
        return await run
    except PeerFault as fault:
        log.info("dispute with %s: %s (%s)", exchange.stream.peer_id, fault.outcome, fault)
        return DisputeResult(fault.outcome, exchange.rounds, code=str(fault) if fault.outcome == "peer_refused" else None,
                             peer_at_fault=fault.outcome != "peer_refused")


async def bisect(stream: Stream, party: Party, *, timing: Timing = Timing(), clock: Clock | None = None) -> DisputeResult:
    """Open a dispute with the peer at the other end of ``stream`` (module doc); the peer's
    faults are outcomes, never raised. ``timing``: this node's bounds on the peer, timed on
    ``clock`` (the node's; node/dispute_exchange.py)."""
    exchange = Exchange(stream, True, clock or Clock(), timing)

    async def run() -> DisputeResult:
        await exchange.send({"t": "trace", "trace": party.commitment.encoded})
        exchange.computing(timing.trace_timeout_s)  # the peer replays the step to trace it
        theirs = await exchange.receive("trace")
        return await _after_traces(exchange, party, _their_trace(exchange, theirs))

    return await _ended(exchange, run())


Find = Callable[[TraceCommitment, AsyncExitStack], Awaitable[Party | str]]
"""``find(theirs, session)``: this node's party for the step of the peer's trace (computed on
demand: a traced replay), or the ``error`` code it answers instead (``no_trace``: it has none to
defend; ``not_disputed``: nothing it counts warrants the replay); what the party needs for the
rest of the dispute (a run's files held) it enters on ``session``, closed when the dispute ends."""


async def answer(exchange: Exchange, find: Find, session: AsyncExitStack) -> DisputeResult:
    """Answer the dispute the peer opened on ``exchange``'s stream: ``find`` gives this node's
    party for the step of the peer's trace, or the code of its refusal (sent as an ``error``:
    the outcome)."""

    async def run() -> DisputeResult:
        theirs = _their_trace(exchange, await exchange.receive("trace"))
        party = await find(theirs, session)
        if isinstance(party, str):
            await exchange.send({"t": "error", "code": party})
            return DisputeResult(party)
        await exchange.send({"t": "trace", "trace": party.commitment.encoded})
        return await _after_traces(exchange, party, theirs)

    return await _ended(exchange, run())


async def _descend(exchange: Exchange, descent: Descent) -> None:
    while not descent.done:
        left, right = descent.children()
        reply = await exchange({"t": "children", "left": left, "right": right}, "children")
        try:
            descent.step(reply["left"], reply["right"])
        except ProtocolError as exc:
            raise PeerFault("peer_malformed", str(exc)) from exc


async def _after_traces(exchange: Exchange, party: Party, theirs: TraceCommitment) -> DisputeResult:
    mine = party.commitment
    # [REJECT] the peer's trace is of this step from this state (the opener chose the step)
    if (theirs.run, theirs.step, theirs.pre_state) != (mine.run, mine.step, mine.pre_state):
        raise PeerFault("peer_malformed", "its trace is not of this step from this state")
    if theirs.ops != mine.ops:
        return DisputeResult("ops_differ", peer_at_fault=True)
    if theirs.root == mine.root:
        return DisputeResult("agree")
    exchange.set_ops(mine.ops)
    descent = Descent(party.tree, theirs.root)
    await _descend(exchange, descent)
    pos = descent.position
    my_record = party.records[pos]
    reply = await exchange({"t": "record", "record": my_record}, "record")
    try:
        their_record = check_record(reply["record"], 1)
    except ProtocolError as exc:
        raise PeerFault("peer_malformed", f"its record: {exc}") from exc
    if their_record["pos"] != pos or leaf_hash(op_leaf(their_record)) != descent.peer_hash:
        raise PeerFault("peer_malformed", f"its record is not the leaf {pos} it revealed")
    key = ("kind", "attrs", "inputs")
    if [my_record[k] for k in key] != [their_record[k] for k in key] or \
            len(my_record["outputs"]) != len(their_record["outputs"]):
        return DisputeResult("records_differ", exchange.rounds, pos, peer_at_fault=True)
    output = next(i for i, (a, b) in enumerate(zip(my_record["outputs"], their_record["outputs"])) if a != b)
    started = exchange.clock.now()
    data = await party.op_data(pos)
    try:
        exchange.computing(exchange.clock.now() - started)  # the peer replays to the op as we did: as slow again is on pace
        return await _in_output(exchange, (mine, theirs), (party, descent), (my_record, their_record), data, output)
    finally:
        data.close()


async def _in_output(exchange: Exchange, traces: tuple[TraceCommitment, TraceCommitment], found: tuple[Party, Descent],
                     records: tuple[dict, dict], data: OpData, output: int) -> DisputeResult:
    """Bisect output ``output`` of the op both descended to, into its chunks; the proof. The op's
    bytes are read in pieces (they may be on disk, node/op_data.py), off the event loop."""
    (party, descent), (my_record, their_record) = found, records
    state = state_output(my_record["kind"])  # the update's outputs are chunked as the state tree is (§18.1)
    tree = await trio.to_thread.run_sync(partial(chunk_tree, data.outputs[output], state=state))
    if tree.root != my_record["outputs"][output]["root"]:
        raise RuntimeError(f"op {descent.position}'s data is not what this party's trace committed")  # our bug
    chunks = Descent(tree, their_record["outputs"][output]["root"])
    await _descend(exchange, chunks)
    c, size = chunks.position, chunk_size(state=state)
    mine_chunk = bytes(chunk_reader(data.outputs[output])[1](c * size, size))
    reply = await exchange({"t": "chunk", "data": mine_chunk}, "chunk")
    if len(reply["data"]) != len(mine_chunk) or \
            leaf_hash(chunk_digest(c, reply["data"], state=state)) != chunks.peer_hash:
        raise PeerFault("peer_malformed", f"its chunk is not the leaf {c} it revealed")
    pos, theirs = descent.position, traces[1]
    claimed = (Opening(c, mine_chunk, tuple(tree.proof(c))), Opening(c, reply["data"], chunks.peer_path()))
    encoded = await trio.to_thread.run_sync(lambda: fraud_proof_at(
        traces, (tuple(party.tree.proof(pos)), descent.peer_path()), records, data.inputs, output, claimed).encode())
    verdict = await trio.to_thread.run_sync(verify_fraud_proof, encoded)
    return DisputeResult("proof", exchange.rounds, pos, encoded, verdict, peer_at_fault=theirs.tracer in verdict.guilty)


class DisputeServer:
    """Answers disputes on :data:`DISPUTE_PROTOCOL`: at most ``max_sessions`` at a time, one per
    peer, and only those ``admit(peer)`` lets through (a node's answering bound, §18.5; more are
    answered ``busy``). When every slot is held, the dispute whose peer this node waits on furthest
    behind its pace (node/dispute_exchange.py) ends, the peer silent, and the newcomer takes its
    slot: peers that walk their rounds slowly cannot hold every slot. ``engaged``: the peers this
    node is in a dispute with, either way (shared with the node's opener, so that two nodes never
    run two disputes at once). A peer at fault in a malformed way is ``penalise``d; each result
    goes to ``on_result(peer, result)`` (a proof: to store and gossip, §18.7)."""

    def __init__(self, find: Find, *, penalise: Callable[[str], None],
                 on_result: Callable[[str, DisputeResult], None], max_sessions: int = 4,
                 timing: Timing = Timing(), clock: Clock | None = None,
                 admit: Callable[[str], bool] = lambda peer: True, engaged: set[str] | None = None) -> None:
        self.find, self.penalise, self.on_result, self.admit = find, penalise, on_result, admit
        self.max_sessions, self.timing, self.clock = max_sessions, timing, clock or Clock()
        self.active: dict[str, Exchange] = {}
        self.engaged = set() if engaged is None else engaged

    def serve(self, p2p) -> None:
        """Answer the dispute protocol on ``p2p`` (a :class:`.p2p.P2P`)."""
        p2p.set_stream_handler(DISPUTE_PROTOCOL, self.handle)

    def _behind_most(self) -> str | None:
        """The peer of an active dispute furthest behind its pace, if any is behind."""
        behind = {peer: exchange.behind() for peer, exchange in self.active.items()}
        peer = max(behind, key=behind.__getitem__, default=None)
        return peer if peer is not None and behind[peer] > 0 else None

    async def handle(self, stream: Stream) -> None:
        peer = stream.peer_id
        full = len(self.active) >= self.max_sessions
        slow = self._behind_most() if full else None
        if peer in self.engaged or (full and slow is None) or not self.admit(peer):
            try:
                await stream.send(encode({"t": "error", "code": "busy"}))
                await stream.close()
            except NetworkError:
                pass  # it went away: nothing owed
            return
        if slow is not None:
            log.info("dispute with %s: its slot goes to %s (behind its pace)", slow, peer)
            self.active.pop(slow).preempt()
        exchange = self.active[peer] = Exchange(stream, False, self.clock, self.timing)
        self.engaged.add(peer)
        try:
            async with AsyncExitStack() as session:
                result = await answer(exchange, self.find, session)
        finally:
            if self.active.get(peer) is exchange:
                del self.active[peer]
            self.engaged.discard(peer)
        if result.outcome == "peer_malformed":
            self.penalise(peer)
        try:
            await stream.close()
        except NetworkError:
            pass
        finally:
            self.on_result(peer, result)
