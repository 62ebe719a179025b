"""Test doubles for the network side of a node's components, and a builder for its ledger
(:func:`open1b.node.ledger.build_ledger`)."""

from __future__ import annotations

import time
from pathlib import Path

import trio

from open1b.node.clock import Clock
from open1b.node.config import NodeConfig
from open1b.node.ledger import Ledger, build_ledger
from open1b.node.metrics import NodeStats
from open1b.node.store import Store
from open1b.protocol import Claim, Identity, RunManifest, select_claim
from open1b.protocol.hashing import blake2b256
from tests.runs import run_manifest


class FakeGossip:
    """Records what a component publishes and whom it penalises; subscribes to nothing."""

    def __init__(self) -> None:
        self.published: list[tuple[str, bytes]] = []
        self.penalised: list[str] = []
        self.validators: dict[str, object] = {}

    def set_validator(self, topic, validator) -> None:
        self.validators[topic] = validator

    async def subscribe(self, topic, handler) -> None:
        pass

    async def publish(self, topic: str, data: bytes) -> None:
        self.published.append((topic, data))

    def penalise(self, peer_id: str) -> None:
        self.penalised.append(peer_id)


class FakeP2P(FakeGossip):
    """The auditor's network side: gossip, plus DHT provider records (kept, never sent)."""

    def __init__(self) -> None:
        super().__init__()
        self.provided: list[str] = []

    async def provide(self, key: str) -> bool:
        self.provided.append(key)
        return True


class FakeClaimBoard:
    """An in-memory DHT with its semantics: every write reaches one shared record store that keeps
    what ``select_claim`` prefers."""

    def __init__(self) -> None:
        self.records: dict[str, bytes] = {}
        self.announced: list[Claim] = []

    async def read(self, key):
        await trio.sleep(0)
        return self.records.get(key)

    async def write(self, key, value):
        await trio.sleep(0)
        old = self.records.get(key)
        if old is not None:
            claims = [Claim.decode(old), Claim.decode(value)]
            if claims[select_claim(claims)].encoded == old:
                return False
        self.records[key] = value
        return True

    async def announce(self, claim):
        self.announced.append(claim)


def auditable_manifest(publisher: Identity, steps: int, created_at: int) -> RunManifest:
    """A manifest this node's engine would replay (its model is a real preset's), with made-up
    state hashes: for tests whose replays are scripted, not computed."""
    from open1b.deterministic.trainer import DEFAULT_PRESET, run_fields  # numba: only for the tests that need it

    fields = run_fields(DEFAULT_PRESET, 0, {})
    return run_manifest(publisher, **fields, steps=steps, created_at=created_at,
                        state_hashes=[blake2b256(b"tests/state", bytes([k])) for k in range(steps + 1)])


class FrozenClock(Clock):
    """Wall time fixed at ``wall_s`` (usable outside trio); trio's clock as usual."""

    def __init__(self, wall_s: int | None = None) -> None:
        super().__init__()
        self.wall_s = int(time.time()) if wall_s is None else wall_s

    def wall_ms(self) -> int:
        return self.wall_s * 1000


def make_ledger(directory: Path, *manifests: RunManifest, identity: Identity | None = None,
                clock: Clock | None = None, gossip: FakeGossip | None = None, **config) -> Ledger:
    """A node's ledger (statements, judge, counting, planner view, replay proof, outbox) over a
    fresh store in ``directory`` that knows ``manifests``, wired as the daemon wires it."""
    directory.mkdir(parents=True, exist_ok=True)
    clock = clock or Clock()
    store = Store(directory / "store.sqlite", now_ms=clock.wall_ms)
    for m in manifests:
        store.add_manifest(m)
    return build_ledger(identity or Identity(b"\x07" * 32), NodeConfig(data_dir=directory, **config), store,
                        gossip or FakeGossip(), clock=clock, stats=NodeStats())
