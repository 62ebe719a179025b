"""Whether peers can dial this node: ``public``, ``private`` or ``unknown``, with the reason.

How (a dial-back over a fresh connection): the node asks a few connected peers, over
:data:`DIALBACK_PROTOCOL`, to dial its libp2p port at the address they see its connection come
from. Each opens a *new* TCP connection there and checks that a libp2p listener greets it (the
multistream-select header every libp2p listener sends first). AutoNAT v1 answers over the
connection the request came on, so a firewalled node passes it; a new connection cannot pass a
NAT or firewall that drops unsolicited connections. The asker chooses only the port: the peer
dials the address the request came from, so nobody can use the service to make a node dial a
third party.

Verdict (:func:`verdict`): ``public`` when at least :data:`MIN_CONFIRMATIONS` peers dialled back
to a global address; ``private`` when that many tried and none could, or reached it only at a
private-range address (RFC 1918, loopback, CGNAT: reachable on that network only, as the reason
says); else ``unknown`` (too few peers answered). What the test cannot tell: that the listener
found is this node's (a port forwarded to another libp2p node would pass).
"""

from __future__ import annotations

import ipaddress
import logging
import random
from dataclasses import dataclass
from typing import Awaitable, Callable

import trio

from open1b.protocol import Open1bError
from open1b.protocol.codec import decode, encode
from open1b.protocol.errors import DecodeError

from .p2p import P2P, FrameTooLarge, Stream

log = logging.getLogger(__name__)

DIALBACK_PROTOCOL = "/open1b/dialback/1.0.0"
# What a libp2p listener sends first on a new connection: multistream-select's header, varint-delimited.
MULTISTREAM_HEADER = b"\x13/multistream/1.0.0\n"
DIAL_TIMEOUT_S = 5.0  # a peer's dial back, connect and greeting together
ASK_TIMEOUT_S = 2 * DIAL_TIMEOUT_S  # a whole request to one peer
MIN_CONFIRMATIONS = 2  # distinct peers that must agree before a verdict
ASK_PEERS = 3  # peers asked per check
CHECK_EVERY_S = 600.0  # how often the node checks again once it has a verdict
RETRY_UNKNOWN_S = 10.0  # and while it has none (too few peers yet): a node behind NAT reserves on relays once it knows
MAX_REQUEST = 64
SERVE_PER_PEER_S = 10.0  # a peer gets at most one dial-back this often
MAX_WAITING = 2  # requests waiting for the one dial; more are refused (keys are free: each waiting holds a stream)


@dataclass(frozen=True)
class Reachability:
    state: str  # "public", "private" or "unknown"
    reason: str

    def as_json(self) -> dict:
        return {"state": self.state, "reason": self.reason}


UNKNOWN = Reachability("unknown", "not checked yet")


@dataclass(frozen=True)
class DialBack:
    """One peer's answer: whether it reached our listener at ``host`` (the address it saw us at)."""
    peer: str
    host: str
    reached: bool


def verdict(answers: list[DialBack]) -> Reachability:
    """The verdict from the dial-backs of distinct peers (the latest answer of each counts)."""
    latest = {a.peer: a for a in answers}
    reached = [a for a in latest.values() if a.reached]
    from_internet = [a for a in reached if _global(a.host)]
    failed = [a for a in latest.values() if not a.reached]
    if len(from_internet) >= MIN_CONFIRMATIONS:
        where = ", ".join(sorted({a.host for a in from_internet}))
        return Reachability("public", f"{len(from_internet)} peers dialled back to {where}")
    if len(latest) >= MIN_CONFIRMATIONS and not from_internet:
        # A peer on our own network reaching us at our LAN address says nothing of the internet:
        # with the others failing (or none asked from outside), nobody out there can dial us.
        parts = []
        if reached:
            lan = ", ".join(sorted({a.host for a in reached}))
            parts.append(f"{len(reached)} peers dialled back to {lan}, a private-range address: reachable on "
                         "that network only, not from the internet")
        if failed:
            seen = ", ".join(sorted({a.host for a in failed}))
            parts.append(f"{len(failed)} peers could not dial back to {seen} (behind NAT or a firewall): this node "
                         "dials out and pulls, and serves nobody directly")
        return Reachability("private", "; ".join(parts))
    if not latest:
        return Reachability("unknown", "no peer answered a dial-back request yet")
    return Reachability("unknown", f"{len(reached)} of {len(latest)} peers dialled back; "
                                   f"{MIN_CONFIRMATIONS} must agree")


def _global(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_global
    except ValueError:
        return False


# -- the asking side --------------------------------------------------------------------------
async def ask(p2p: P2P, peer: str, port: int) -> DialBack | None:
    """Ask ``peer`` to dial our libp2p ``port`` back; None if it did not answer sensibly."""
    try:
        with trio.fail_after(ASK_TIMEOUT_S):
            stream = await p2p.open_stream(peer, DIALBACK_PROTOCOL)
            try:
                await stream.send(encode({"port": port}))
                answer = decode(await stream.receive(MAX_REQUEST), max_size=MAX_REQUEST)
            finally:
                await stream.reset()
    except (Open1bError, trio.TooSlowError) as exc:
        log.debug("dial-back request to %s: %s", peer, exc)
        return None
    if type(answer) is not dict or type(answer.get("reached")) is not bool or type(answer.get("host")) is not str:
        return None
    return DialBack(peer, answer["host"][:64], answer["reached"])


async def ask_peers(p2p: P2P, port: int, rng: random.Random) -> list[DialBack]:
    """Ask up to ASK_PEERS connected peers at once; their answers."""
    peers = p2p.connected_peers()
    rng.shuffle(peers)
    answers: list[DialBack] = []

    async def one(peer: str) -> None:
        answer = await ask(p2p, peer, port)
        if answer is not None:
            answers.append(answer)

    async with trio.open_nursery() as nursery:
        for peer in peers[:ASK_PEERS]:
            nursery.start_soon(one, peer)
    return answers


class ReachabilityMonitor:
    """The node's current verdict, checked again every CHECK_EVERY_S (RETRY_UNKNOWN_S while unknown)."""

    def __init__(self, p2p: P2P, port: Callable[[], int], rng: random.Random,
                 sleep: Callable[[float], Awaitable[None]]) -> None:
        self.p2p, self.port, self.rng, self.sleep = p2p, port, rng, sleep
        self.current = UNKNOWN

    async def serve(self, *, ready: trio.Event) -> None:
        await ready.wait()
        while True:
            found = await self.check()
            await self.sleep(RETRY_UNKNOWN_S if found.state == "unknown" else CHECK_EVERY_S)

    async def check(self) -> Reachability:
        """Ask peers once and act on the verdict."""
        answers = await ask_peers(self.p2p, self.port(), self.rng)
        found = verdict(answers)
        if found != self.current:
            log.info("reachability: %s (%s)", found.state, found.reason)
        self.current = found
        self.p2p.reachability = found.state  # a private node reserves on relays, a public one serves them
        # a public node announces the address peers reached it at (behind a 1:1 NAT, as on most
        # clouds, no interface has it); nobody else's observations of us are announced
        self.p2p.dialled_back_at = {a.host for a in answers if a.reached} if found.state == "public" else set()
        if found.state != "unknown":
            await self.p2p.dht.serve_as(client=dht_client(found, answers))
        return found


def dht_client(found: Reachability, answers: list[DialBack]) -> bool:
    """Whether a node with verdict ``found`` runs the DHT in client mode: when it is private and
    some peer could not dial it back (behind NAT: the peers that fail are the internet's). A node
    every asked peer reached, at private-range addresses only (a LAN, a devnet on loopback), is
    dialable by the peers it has and stays a server: were it a client, such a network would have no
    DHT at all."""
    return found.state == "private" and not all(a.reached for a in answers)


# -- the answering side -----------------------------------------------------------------------
async def dial_back(host: str, port: int, *, timeout_s: float = DIAL_TIMEOUT_S) -> bool:
    """Whether a new TCP connection to ``host:port`` is greeted by a libp2p listener."""
    try:
        with trio.fail_after(timeout_s):
            stream = await trio.open_tcp_stream(host, port)
            try:
                got = b""
                while len(got) < len(MULTISTREAM_HEADER):
                    chunk = await stream.receive_some(len(MULTISTREAM_HEADER) - len(got))
                    if not chunk:
                        return False
                    got += chunk
                return got == MULTISTREAM_HEADER
            finally:
                await trio.aclose_forcefully(stream)
    except (OSError, trio.TooSlowError, trio.BrokenResourceError):
        return False


class DialBackServer:
    """The handler of DIALBACK_PROTOCOL: dials the asker's address (as its connection shows it)
    at the port it names, one dial at a time with at most MAX_WAITING requests waiting, at most
    once per peer per SERVE_PER_PEER_S; a malformed request is refused and its sender penalised."""

    def __init__(self, dial: Callable[[str, int], Awaitable[bool]] = dial_back, *,
                 penalise: Callable[[str], None] = lambda peer: None) -> None:
        self.dial, self.penalise = dial, penalise
        self._last: dict[str, float] = {}
        self._one = trio.Lock()
        self._held = 0  # requests dialling or waiting to

    async def handle(self, stream: Stream) -> None:
        host = stream.remote_host
        try:
            request = decode(await stream.receive(MAX_REQUEST), max_size=MAX_REQUEST)
        except (FrameTooLarge, DecodeError):
            request = None
        port = request.get("port") if type(request) is dict else None
        # [REJECT] a request that is not {"port": 1..65535}
        if type(port) is not int or not 0 < port < 65536:
            self.penalise(stream.peer_id)
            await stream.reset()
            return
        now = trio.current_time()
        if host is None or self._held > MAX_WAITING or \
                now - self._last.get(stream.peer_id, -SERVE_PER_PEER_S) < SERVE_PER_PEER_S:
            await stream.reset()
            return
        self._last = {p: t for p, t in self._last.items() if now - t < SERVE_PER_PEER_S}  # stays bounded
        self._last[stream.peer_id] = now
        self._held += 1
        try:
            async with self._one:
                reached = await self.dial(host, port)
        finally:
            self._held -= 1
        await stream.send(encode({"host": host, "reached": reached}))
        await stream.close()
