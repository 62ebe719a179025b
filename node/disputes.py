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
(``peer_malformed``, penalised by the caller); a peer that does not answer an exchange within
``round_timeout_s`` loses it (``peer_silent``: this node's finding, as silence proves nothing to
others).
"""

from __future__ import annotations

import logging
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Awaitable, Callable, Sequence

import trio

from open1b.protocol.codec import encode
from open1b.protocol.dispute.bisection import DISPUTE_PROTOCOL, MAX_MESSAGE, ROUND_TIMEOUT_S, Descent, decode_message
from open1b.protocol.dispute.proof import InputBytes, Opening, check_record, fraud_proof_at
from open1b.protocol.dispute.referee import FraudVerdict, verify_fraud_proof
from open1b.protocol.dispute.trace import TraceCommitment, chunk_digest, chunk_size, chunk_tree, op_leaf, state_output
from open1b.protocol.errors import ProtocolError
from open1b.protocol.identity import public_key_from_peer_id
from open1b.protocol.merkle import MerkleTree, leaf_hash

from .p2p import FrameTooLarge, NetworkError, Stream

log = logging.getLogger("open1b.node.disputes")

OpData = Callable[[int], Awaitable[tuple[Sequence[InputBytes], Sequence[bytes]]]]
"""``op_data(pos)``: op ``pos``'s input bytes (with tensor proofs for state inputs) and output
bytes, as this party computed them (a replay to that op with ``OpTrace(keep={pos})``)."""


@dataclass(frozen=True)
class Party:
    """One side of a dispute over a step: its signed trace commitment, trace tree and records,
    and how to get the data of one op."""

    commitment: TraceCommitment
    tree: MerkleTree
    records: Sequence[dict]
    op_data: OpData


@dataclass(frozen=True)
class DisputeResult:
    """How a bisection ended. ``outcome``: ``agree``, ``proof`` (``proof`` and ``verdict`` set),
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


class _PeerFault(Exception):
    def __init__(self, outcome: str, reason: str) -> None:
        super().__init__(reason)
        self.outcome = outcome


class _Exchange:
    """One message each way per call, the opener first; every receive bounded in size and time."""

    def __init__(self, stream: Stream, opener: bool, timeout_s: float) -> None:
        self.stream, self.opener, self.timeout_s = stream, opener, timeout_s
        self.rounds = 0

    async def __call__(self, message: dict, expected: str) -> dict:
        self.rounds += expected == "children"
        if self.opener:
            await self.send(message)
            return await self.receive(expected)
        reply = await self.receive(expected)
        await self.send(message)
        return reply

    async def send(self, message: dict) -> None:
        try:
            await self.stream.send(encode(message))
        except NetworkError as exc:
            raise _PeerFault("peer_silent", f"the stream broke: {exc}") from exc

    async def receive(self, expected: str, timeout_s: float | None = None) -> dict:
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        with trio.move_on_after(timeout_s):
            try:
                data = await self.stream.receive(MAX_MESSAGE)
            except FrameTooLarge as exc:
                raise _PeerFault("peer_malformed", str(exc)) from exc
            except NetworkError as exc:
                raise _PeerFault("peer_silent", f"the stream broke: {exc}") from exc
            try:
                message = decode_message(data, expected)
            except ProtocolError as exc:
                raise _PeerFault("peer_malformed", f"{exc.code}: {exc}") from exc
            if message["t"] == "error":
                raise _PeerFault("peer_refused", message["code"])
            return message
        raise _PeerFault("peer_silent", f"no {expected} within {timeout_s:.0f} s")


def _their_trace(exchange: _Exchange, message: dict) -> TraceCommitment:
    try:
        theirs = TraceCommitment.decode(message["trace"])
    except ProtocolError as exc:
        raise _PeerFault("peer_malformed", f"its trace: {exc}") from exc
    # [REJECT] the trace is signed by the peer at the other end
    if theirs.tracer != public_key_from_peer_id(exchange.stream.peer_id):
        raise _PeerFault("peer_malformed", "its trace is signed by another key")
    return theirs


async def _ended(exchange: _Exchange, run) -> DisputeResult:
    try:
        return await run
    except _PeerFault as fault:
        log.info("dispute with %s: %s (%s)", exchange.stream.peer_id, fault.outcome, fault)
        return DisputeResult(fault.outcome, exchange.rounds, code=str(fault) if fault.outcome == "peer_refused" else None,
                             peer_at_fault=fault.outcome != "peer_refused")


async def bisect(stream: Stream, party: Party, *, round_timeout_s: float = ROUND_TIMEOUT_S,
                 trace_timeout_s: float | None = None) -> DisputeResult:
    """Open a dispute with the peer at the other end of ``stream`` (module doc); the peer's
    faults are outcomes, never raised. ``trace_timeout_s``: how long the peer may take to answer
    the first exchange with its trace (a replay of the step: the replay deadline; default
    ``round_timeout_s``)."""
    exchange = _Exchange(stream, True, round_timeout_s)

    async def run() -> DisputeResult:
        await exchange.send({"t": "trace", "trace": party.commitment.encoded})
        theirs = await exchange.receive("trace", trace_timeout_s)
        return await _after_traces(exchange, party, _their_trace(exchange, theirs))

    return await _ended(exchange, run())


Find = Callable[[TraceCommitment, AsyncExitStack], Awaitable[Party | str]]
"""``find(theirs, session)``: this node's party for the step of the peer's trace (computed on
demand: a traced replay), or the ``error`` code it answers instead (``no_trace``: it has none to
defend; ``not_disputed``: nothing it counts warrants the replay); what the party needs for the
rest of the dispute (a run's files held) it enters on ``session``, closed when the dispute ends."""


async def answer(stream: Stream, find: Find, session: AsyncExitStack, *,
                 round_timeout_s: float = ROUND_TIMEOUT_S) -> DisputeResult:
    """Answer a dispute the peer opened: ``find`` gives this node's party for the step of the
    peer's trace, or the code of its refusal (sent as an ``error``: the outcome)."""
    exchange = _Exchange(stream, False, round_timeout_s)

    async def run() -> DisputeResult:
        theirs = _their_trace(exchange, await exchange.receive("trace"))
        party = await find(theirs, session)
        if isinstance(party, str):
            await exchange.send({"t": "error", "code": party})
            return DisputeResult(party)
        await exchange.send({"t": "trace", "trace": party.commitment.encoded})
        return await _after_traces(exchange, party, theirs)

    return await _ended(exchange, run())


async def _descend(exchange: _Exchange, descent: Descent) -> None:
    while not descent.done:
        left, right = descent.children()
        reply = await exchange({"t": "children", "left": left, "right": right}, "children")
        try:
            descent.step(reply["left"], reply["right"])
        except ProtocolError as exc:
            raise _PeerFault("peer_malformed", str(exc)) from exc


async def _after_traces(exchange: _Exchange, party: Party, theirs: TraceCommitment) -> DisputeResult:
    mine = party.commitment
    # [REJECT] the peer's trace is of this step from this state (the opener chose the step)
    if (theirs.run, theirs.step, theirs.pre_state) != (mine.run, mine.step, mine.pre_state):
        raise _PeerFault("peer_malformed", "its trace is not of this step from this state")
    if theirs.ops != mine.ops:
        return DisputeResult("ops_differ", peer_at_fault=True)
    if theirs.root == mine.root:
        return DisputeResult("agree")
    descent = Descent(party.tree, theirs.root)
    await _descend(exchange, descent)
    pos = descent.position
    my_record = party.records[pos]
    reply = await exchange({"t": "record", "record": my_record}, "record")
    try:
        their_record = check_record(reply["record"], 1)
    except ProtocolError as exc:
        raise _PeerFault("peer_malformed", f"its record: {exc}") from exc
    if their_record["pos"] != pos or leaf_hash(op_leaf(their_record)) != descent.peer_hash:
        raise _PeerFault("peer_malformed", f"its record is not the leaf {pos} it revealed")
    key = ("kind", "attrs", "inputs")
    if [my_record[k] for k in key] != [their_record[k] for k in key] or \
            len(my_record["outputs"]) != len(their_record["outputs"]):
        return DisputeResult("records_differ", exchange.rounds, pos, peer_at_fault=True)
    output = next(i for i, (a, b) in enumerate(zip(my_record["outputs"], their_record["outputs"])) if a != b)
    inputs, outputs = await party.op_data(pos)
    data = memoryview(outputs[output]).cast("B")
    state = state_output(my_record["kind"])  # the update's outputs are chunked as the state tree is (§18.1)
    tree = chunk_tree(data, state=state)
    if tree.root != my_record["outputs"][output]["root"]:
        raise RuntimeError(f"op {pos}'s data is not what this party's trace committed")  # our bug, not the peer's
    chunks = Descent(tree, their_record["outputs"][output]["root"])
    await _descend(exchange, chunks)
    c = chunks.position
    size = chunk_size(state=state)
    mine_chunk = bytes(data[c * size:(c + 1) * size])
    reply = await exchange({"t": "chunk", "data": mine_chunk}, "chunk")
    if len(reply["data"]) != len(mine_chunk) or \
            leaf_hash(chunk_digest(c, reply["data"], state=state)) != chunks.peer_hash:
        raise _PeerFault("peer_malformed", f"its chunk is not the leaf {c} it revealed")
    proof = fraud_proof_at((mine, theirs), (tuple(party.tree.proof(pos)), descent.peer_path()),
                           (my_record, their_record), inputs, output,
                           (Opening(c, mine_chunk, tuple(tree.proof(c))), Opening(c, reply["data"], chunks.peer_path())))
    encoded = proof.encode()
    # up to seconds at MAX_FRAUD_PROOF_SIZE: off the event loop, which every other peer's stream shares
    verdict = await trio.to_thread.run_sync(verify_fraud_proof, encoded)
    return DisputeResult("proof", exchange.rounds, pos, encoded, verdict, peer_at_fault=theirs.tracer in verdict.guilty)


class DisputeServer:
    """Answers disputes on :data:`DISPUTE_PROTOCOL`: at most ``max_sessions`` at a time, one per
    peer, and only those ``admit(peer)`` lets through (a node's answering bound, §18.5; more are
    answered ``busy``). ``engaged``: the peers this node is in a dispute with, either way (shared
    with the node's opener, so that two nodes never run two disputes at once). A peer at fault in
    a malformed way is ``penalise``d; each result goes to ``on_result(peer, result)`` (a proof: to
    store and gossip, §18.7)."""

    def __init__(self, find: Find, *, penalise: Callable[[str], None],
                 on_result: Callable[[str, DisputeResult], None], max_sessions: int = 4,
                 round_timeout_s: float = ROUND_TIMEOUT_S, admit: Callable[[str], bool] = lambda peer: True,
                 engaged: set[str] | None = None) -> None:
        self.find, self.penalise, self.on_result, self.admit = find, penalise, on_result, admit
        self.max_sessions, self.round_timeout_s = max_sessions, round_timeout_s
        self.active: set[str] = set()
        self.engaged = set() if engaged is None else engaged

    def serve(self, p2p) -> None:
        """Answer the dispute protocol on ``p2p`` (a :class:`.p2p.P2P`)."""
        p2p.set_stream_handler(DISPUTE_PROTOCOL, self.handle)

    async def handle(self, stream: Stream) -> None:
        peer = stream.peer_id
        if peer in self.engaged or len(self.active) >= self.max_sessions or not self.admit(peer):
            try:
                await stream.send(encode({"t": "error", "code": "busy"}))
                await stream.close()
            except NetworkError:
                pass  # it went away: nothing owed
            return
        self.active.add(peer)
        self.engaged.add(peer)
        try:
            async with AsyncExitStack() as session:
                result = await answer(stream, self.find, session, round_timeout_s=self.round_timeout_s)
        finally:
            self.active.discard(peer)
            self.engaged.discard(peer)
        if result.outcome == "peer_malformed":
            self.penalise(peer)
        try:
            await stream.close()
        except NetworkError:
            pass
        finally:
            self.on_result(peer, result)
