"""One dispute's exchanges on its stream, and the peer's clock (docs/protocol.md §18.5, r28).

Each exchange is one message each way, the opener's first. Every wait on the peer is bounded in
size (its type's bound) and in time, measured on the node's clock:

* a **compute wait** — the opener's wait for the answerer's ``trace``, and either side's first wait
  after the ``record``s (both replay the step to that op for its data) — at most
  ``compute_timeout_s`` (the spec's ``TRACE_TIMEOUT_S``: one traced replay);
* every other wait at most ``round_timeout_s``, and all of them together at most the rounds
  budget (:func:`~open1b.protocol.dispute.bisection.rounds_budget` of the op count), so a peer
  that answers each round just inside its timeout loses after a few rounds instead of holding
  the dispute for ⌈log2 ops⌉ + ``CHUNK_ROUNDS`` round timeouts (38 minutes at ``gpt-1b``).

A peer past a bound loses as a silent one does (``peer_silent``: this node's finding).

Its **pace** is what an honest peer needs so far: ``pace_s`` for each wait begun, for a compute
wait the time this node took for the same replay (a peer as slow again is on pace), and one round
timeout besides. A peer this node waits on behind its pace may lose its answer slot to another
peer when every slot is held (:meth:`Exchange.preempt`; node/disputes.py's server).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import trio

from open1b.protocol.codec import encode
from open1b.protocol.dispute.bisection import (
    MAX_MESSAGE,
    ROUND_PACE_S,
    ROUND_TIMEOUT_S,
    TRACE_TIMEOUT_S,
    decode_message,
    rounds_budget,
)
from open1b.protocol.errors import ProtocolError

from .clock import Clock
from .p2p import FrameTooLarge, NetworkError, Stream


class PeerFault(Exception):
    """The peer ended the dispute: ``outcome`` is ``peer_silent``, ``peer_malformed`` or ``peer_refused``."""

    def __init__(self, outcome: str, reason: str) -> None:
        super().__init__(reason)
        self.outcome = outcome


class Timing(NamedTuple):
    """A node's bounds on its peers (the spec's; a node MAY wait less, tests and devnets do)."""

    round_timeout_s: float = ROUND_TIMEOUT_S
    pace_s: float = ROUND_PACE_S
    trace_timeout_s: float = TRACE_TIMEOUT_S  # a compute wait's


class Exchange:
    """A dispute's stream, and the time its peer has taken (module doc)."""

    def __init__(self, stream: Stream, opener: bool, clock: Clock, timing: Timing) -> None:
        self.stream, self.opener, self.clock = stream, opener, clock
        self.round_timeout_s, self.pace_s, self.compute_timeout_s = timing
        self.rounds = 0
        self.budget = self.round_timeout_s  # of the round waits; set from the op count once the traces are in
        self.spent_rounds = 0.0  # the peer's time over its round waits
        self.spent = 0.0  # ... over all waits
        self.paced = self.round_timeout_s  # its pace so far: the slack, and each wait's allowance
        self.waiting_since: float | None = None
        self.preempted = False
        self._compute: float | None = None
        self._scope: trio.CancelScope | None = None

    def set_ops(self, ops: int) -> None:
        """The traces are of ``ops`` ops: the rounds budget that count implies."""
        self.budget = rounds_budget(ops, round_timeout_s=self.round_timeout_s, pace_s=self.pace_s)

    def computing(self, paced: float) -> None:
        """The next wait is on the peer's traced replay (a compute wait); ``paced``: what its pace allows."""
        self._compute = paced

    def behind(self) -> float:
        """How far the peer is behind its pace while this node waits on it (> 0: behind); else -inf."""
        if self.waiting_since is None:
            return -math.inf
        return self.spent + self.clock.now() - self.waiting_since - self.paced

    def preempt(self) -> None:
        """End the dispute now, the peer silent: its slot is wanted and it is behind its pace."""
        self.preempted = True
        if self._scope is not None:
            self._scope.cancel()

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
            raise PeerFault("peer_silent", f"the stream broke: {exc}") from exc

    async def receive(self, expected: str) -> dict:
        compute, self._compute = self._compute, None
        limit = self.compute_timeout_s if compute is not None else \
            min(self.round_timeout_s, self.budget - self.spent_rounds)
        self.paced += self.pace_s if compute is None else compute
        data = None
        start = self.waiting_since = self.clock.now()
        try:
            with trio.CancelScope() as self._scope, trio.move_on_after(max(limit, 0.0)):
                data = await self.stream.receive(MAX_MESSAGE)
        except FrameTooLarge as exc:
            raise PeerFault("peer_malformed", str(exc)) from exc
        except NetworkError as exc:
            raise PeerFault("peer_silent", f"the stream broke: {exc}") from exc
        finally:
            waited = self.clock.now() - start
            self.waiting_since, self._scope = None, None
            self.spent += waited
            self.spent_rounds += waited if compute is None else 0.0
        if self.preempted:
            raise PeerFault("peer_silent", f"behind its pace by {self.spent - self.paced:.0f} s when its slot was wanted")
        if data is None or waited > limit:
            what = "its rounds' budget" if compute is None and limit < self.round_timeout_s else f"{limit:.0f} s"
            raise PeerFault("peer_silent", f"no {expected} within {what}")
        try:
            message = decode_message(data, expected)
        except ProtocolError as exc:
            raise PeerFault("peer_malformed", f"{exc.code}: {exc}") from exc
        if message["t"] == "error":
            raise PeerFault("peer_refused", message["code"])
        return message
