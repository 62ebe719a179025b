"""Test doubles for the network side of a node's components, and a builder for :class:`Ingest`."""

from __future__ import annotations

import time
from pathlib import Path

from open1b.node.clock import Clock
from open1b.node.config import NodeConfig
from open1b.node.ingest import Ingest
from open1b.node.metrics import NodeStats
from open1b.node.store import Store
from open1b.protocol import Identity, RunManifest


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


class FrozenClock(Clock):
    """Wall time fixed at ``wall_s`` (usable outside trio); trio's clock as usual."""

    def __init__(self, wall_s: int | None = None) -> None:
        super().__init__()
        self.wall_s = int(time.time()) if wall_s is None else wall_s

    def wall(self) -> int:
        return self.wall_s


def make_ingest(directory: Path, *manifests: RunManifest, identity: Identity | None = None,
                clock: Clock | None = None, gossip: FakeGossip | None = None, **config) -> Ingest:
    """An :class:`Ingest` over a fresh store in ``directory`` that knows ``manifests``."""
    directory.mkdir(parents=True, exist_ok=True)
    store = Store(directory / "store.sqlite")
    for m in manifests:
        store.add_manifest(m)
    return Ingest(identity or Identity(b"\x07" * 32), NodeConfig(data_dir=directory, **config), store,
                  gossip or FakeGossip(), clock=clock or Clock(), stats=NodeStats())
