"""Which connected peers answer: a peer that lets a request time out is set aside — not asked
and not waited on — until a ping shows it answers again.

Why: when the network splits, connections to the other side stay open but carry nothing (a
link that goes down, a router that drops everything), so nothing tells libp2p the peer is gone.
py-libp2p's DHT asks every peer near a key in every walk and waits out its 10-s query timeout on
each that does not answer; a claim is three walks (read, write, re-read), so while half the
network was unreachable one claim attempt took 40–80 s and, under CPU load, a half made no
attestation for minutes (docs/reliability.md, "Findings"). Here one unanswered request costs
at most :data:`UNANSWERED_AFTER_S`, once; later requests to that peer fail at once, and a
background probe (:func:`probe_forever`) lets it back in when it answers a ping.

Setting a peer aside is never a verdict on it (nothing is penalised): under heavy load a live
peer may be set aside for a few seconds, which costs only that the DHT skips one of the copies
it would have stored or read — claims are hints, and correctness never rests on them.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import trio

log = logging.getLogger(__name__)

# One request to one peer (a DHT query, opening a stream, a ping) that takes longer than this
# counts as unanswered. A DHT request takes 50–500 ms on the internet; on a shared two-core machine
# running two devnets it took up to 9 s, and live peers were set aside there for 1–7 s at a time
# (a cost only to that many seconds of DHT replication). At 10 s (py-libp2p's own query bound) a
# half's first attestation after a split came up to 33 s late (docs/reliability.md, "Findings").
UNANSWERED_AFTER_S = 5.0
# A set-aside peer is pinged after this long, then at doubling intervals up to PROBE_MAX_S.
PROBE_FIRST_S = 1.0
PROBE_MAX_S = 16.0
# A peer that has not answered a probe for this long is forgotten (the table stays bounded); the
# next request to it, if any, costs one UNANSWERED_AFTER_S again.
FORGET_AFTER_S = 600.0


@dataclass
class _SetAside:
    since: float
    probe_at: float
    interval: float


class PeerLiveness:
    """Bookkeeping only (no I/O): which peers are set aside, and when each is due for a probe."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._aside: dict[str, _SetAside] = {}

    def usable(self, peer: str) -> bool:
        return peer not in self._aside

    def set_aside(self) -> list[str]:
        return sorted(self._aside)

    def unanswered(self, peer: str, what: str) -> None:
        """``peer`` let a request (``what``) time out: set it aside (if it is not already)."""
        if peer in self._aside:
            return
        now = self.clock()
        self._aside[peer] = _SetAside(since=now, probe_at=now + PROBE_FIRST_S, interval=PROBE_FIRST_S)
        log.info("peer %s set aside: %s unanswered after %.0f s", peer, what, UNANSWERED_AFTER_S)

    def answered(self, peer: str) -> None:
        """``peer`` answered a probe: ask it again."""
        entry = self._aside.pop(peer, None)
        if entry is not None:
            log.info("peer %s answers again after %.1f s set aside", peer, self.clock() - entry.since)

    def probe_failed(self, peer: str) -> None:
        entry = self._aside.get(peer)
        if entry is None:
            return
        now = self.clock()
        if now - entry.since > FORGET_AFTER_S:
            del self._aside[peer]
            return
        entry.interval = min(entry.interval * 2, PROBE_MAX_S)
        entry.probe_at = now + entry.interval

    def due(self) -> list[str]:
        """Set-aside peers whose probe is due; each is then not due again until it has been probed."""
        now = self.clock()
        out = [p for p, e in self._aside.items() if e.probe_at <= now]
        for peer in out:
            self._aside[peer].probe_at = math.inf  # until probe_failed reschedules it
        return out

    def next_probe_in(self) -> float:
        if not self._aside:
            return PROBE_FIRST_S
        return max(0.0, min(e.probe_at for e in self._aside.values()) - self.clock())


async def probe_forever(liveness: PeerLiveness, ping: Callable[[str], Awaitable[bool]]) -> None:
    """Ping set-aside peers when due (each ping bounded by the caller), letting back those that answer."""

    async def probe(peer: str) -> None:
        if await ping(peer):
            liveness.answered(peer)
        else:
            liveness.probe_failed(peer)

    async with trio.open_nursery() as nursery:
        while True:
            for peer in liveness.due():
                nursery.start_soon(probe, peer)
            await trio.sleep(min(PROBE_FIRST_S, liveness.next_probe_in()))


# -- the DHT's requests to single peers --------------------------------------------------------
# py-libp2p 0.8.1 sends every DHT request to one peer through one of these methods; what each
# returns when the peer could not be asked (as the method itself returns on a failure).
def _no_closer_peers(kwargs: dict) -> Any:
    return []


def _no_value(kwargs: dict) -> Any:
    return (None, []) if kwargs.get("return_closer_peers") else None


def _not_stored(kwargs: dict) -> Any:
    return False


def _no_providers(kwargs: dict) -> Any:
    return [], []


_DHT_REQUESTS = (
    ("peer_routing", "_query_peer_for_closest", _no_closer_peers),
    ("value_store", "_get_from_peer", _no_value),
    ("value_store", "_store_at_peer", _not_stored),
    ("provider_store", "_send_add_provider", _not_stored),
    ("provider_store", "_get_providers_from_peer_with_closers", _no_providers),
)


def guard_dht_requests(dht: Any, liveness: PeerLiveness) -> None:
    """Route each of ``dht``'s single-peer requests through ``liveness``: a set-aside peer is not
    asked (the request fails at once, as if the peer had refused it); a request unanswered after
    :data:`UNANSWERED_AFTER_S` is abandoned and its peer set aside."""
    for part, method, failed in _DHT_REQUESTS:
        owner = getattr(dht, part)
        setattr(owner, method, _guarded(getattr(owner, method), method, failed, liveness))


def _guarded(request: Callable[..., Awaitable[Any]], name: str, failed: Callable[[dict], Any],
             liveness: PeerLiveness) -> Callable[..., Awaitable[Any]]:
    async def guarded(peer, *args, **kwargs):
        who = peer.to_base58()
        if not liveness.usable(who):
            return failed(kwargs)
        with trio.move_on_after(UNANSWERED_AFTER_S):
            return await request(peer, *args, **kwargs)
        liveness.unanswered(who, f"DHT {name.strip('_')}")
        return failed(kwargs)

    return guarded
