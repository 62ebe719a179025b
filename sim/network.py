"""The simulated network: a DHT for claim records and gossip for statements.

DHT: one register per key with the semantics the daemon's record validator gives storing
nodes — a record must be a valid claim under its own key, and a stored record is replaced only
by one that ``select_claim`` (the protocol's strict total order) prefers. An operation takes a
log-uniform latency; the register is read or written half-way through. With probability
``dht_loss`` a read gets no answer (after ``dht_timeout_s`` it reports "no record", as the
daemon's ``get_record`` does when the lookup fails) and a write does not land although the
writer believes it did.

Gossip: a statement published at t reaches node i at t + d(i, statement): a log-uniform mesh
latency or, with probability ``gossip_loss``, the next sync with a random peer (the daemon pulls
from one peer every ``sync_interval_s``) plus another latency. d is a hash of (seed, node,
statement), so it is deterministic and costs nothing until someone asks.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from open1b.protocol import Claim, claim_key, select_claim

from .loop import Delay

if TYPE_CHECKING:
    from .crypto import MessageCache

_M64 = (1 << 64) - 1


@dataclass(frozen=True)
class NetworkModel:
    dht_latency_s: tuple[float, float] = (0.05, 0.5)
    dht_loss: float = 0.01
    dht_timeout_s: float = 5.0
    gossip_latency_s: tuple[float, float] = (0.05, 1.0)
    gossip_loss: float = 0.01
    sync_interval_s: float = 2.0

    @property
    def max_gossip_delay(self) -> float:
        return 2 * self.gossip_latency_s[1] + self.sync_interval_s

    def dht_latency(self, rng: random.Random) -> float:
        lo, hi = self.dht_latency_s
        return lo * (hi / lo) ** rng.random() if hi > lo else lo


def _mix(x: int) -> int:
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


_UNIT = 1.0 / (1 << 64)


class Gossip:
    def __init__(self, model: NetworkModel, seed: int) -> None:
        self.model, self.seed = model, seed
        lo, hi = model.gossip_latency_s
        self._lo, self._log_ratio = lo, math.log(hi / lo) if hi > lo else 0.0
        self._key = _mix(seed & _M64)

    def delay(self, node: int, statement: int) -> float:
        """Seconds from publication until ``node`` holds ``statement``."""
        m = self.model
        h = _mix(self._key ^ ((node * 0x9E3779B97F4A7C15 + statement * 0xD1B54A32D192ED03) & _M64))
        d = self._lo * math.exp(self._log_ratio * h * _UNIT)
        g = _mix(h ^ 0x5851F42D4C957F2D)
        if g * _UNIT < m.gossip_loss:
            # missed on the mesh: arrives with the next pull from a peer that has it
            g2 = _mix(g)
            d += m.sync_interval_s * (g2 >> 32) / (1 << 32)
            d += self._lo * math.exp(self._log_ratio * (g2 & 0xFFFFFFFF) / (1 << 32))
        return d


class SimDHT:
    def __init__(self, cache: MessageCache, on_stored) -> None:
        self.cache = cache
        self.records: dict[str, bytes] = {}
        self.on_stored = on_stored  # (claim, writer) when a record is stored
        self.reads = self.writes = 0

    def get(self, key: str) -> bytes | None:
        self.reads += 1
        return self.records.get(key)

    def put(self, key: str, value: bytes, writer) -> bool:
        self.writes += 1
        claim = self.cache.decode(value)
        if claim_key(claim.run, claim.step, claim.slot) != key:
            return False  # the daemon's record validator rejects a claim under a foreign key
        old = self.records.get(key)
        if old == value:
            return True
        if old is not None and select_claim([self.cache.decode(old), claim]) == 0:
            return False
        self.records[key] = value
        self.on_stored(claim, writer)
        return True


class SimBoard:
    """One node's :class:`~open1b.node.claim_records.ClaimBoard` on the simulated network."""

    def __init__(self, dht: SimDHT, model: NetworkModel, rng: random.Random, node, announce) -> None:
        self.dht, self.model, self.rng, self.node, self._announce = dht, model, rng, node, announce

    async def read(self, key: str) -> bytes | None:
        latency = self.model.dht_latency(self.rng)
        if self.rng.random() < self.model.dht_loss:
            await Delay(self.model.dht_timeout_s)
            return None
        await Delay(latency / 2)
        value = self.dht.get(key)
        await Delay(latency / 2)
        return value

    async def write(self, key: str, value: bytes) -> bool:
        latency = self.model.dht_latency(self.rng)
        lost = self.rng.random() < self.model.dht_loss
        await Delay(latency / 2)
        stored = True if lost else self.dht.put(key, value, self.node)
        await Delay(latency / 2)
        return stored

    async def announce(self, claim: Claim) -> None:
        self._announce(claim, self.node)
