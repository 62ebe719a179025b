"""A simulation's parameters (:class:`Scenario`) and what every strategy shares: the nodes'
hardware, their online/offline schedule (:class:`Population`) and the result record.

Given the same seed, every strategy sees the same machines come and go at the same times, so
differences between strategies are differences of strategy.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from typing import Callable

from .hardware import HOUR, VOLUNTEER_MIX, Hardware, assign, class_capacity, describe
from .loop import EventLoop
from .network import NetworkModel

STRATEGIES = ("open1b", "central", "segments", "random", "random-aware")
YEAR = 365 * 24 * HOUR


@dataclass(frozen=True)
class Churn:
    """Each node alternates exponentially distributed online and offline periods. A node that
    leaves mid-replay loses that replay; it comes back with the same key and data."""

    mean_online_s: float = 8 * HOUR
    mean_offline_s: float = 8 * HOUR

    @property
    def availability(self) -> float:
        return self.mean_online_s / (self.mean_online_s + self.mean_offline_s)


@dataclass(frozen=True)
class Scenario:
    nodes: int
    steps: int
    redundancy: int = 2
    strategy: str = "open1b"
    mix: tuple[tuple[Hardware, float], ...] = VOLUNTEER_MIX
    network: NetworkModel = field(default_factory=NetworkModel)
    lease_s: int = 3600
    idle_poll_s: float = 60.0
    churn: Churn | None = None
    adversary_share: float = 0.0
    adversary: str = "lazy"  # "lazy": attests match without replaying; "liar": reports the opposite
    forged_steps: int = 0  # steps whose published post-state the trainer forged
    segment: int = 100  # the incumbent's sequential segment length
    seed: int = 0
    crypto: str = "stand-in"  # see sim/crypto.py
    view: str = "overlay"  # "overlay": shared index + per-node lag; "exact": one real index per node
    parking: bool = True  # skip idle polls that provably find nothing (overlay view only)
    max_seconds: float = 20 * YEAR
    start_s: tuple[float, ...] = ()  # when each node starts auditing (default: all at 0; not with churn)
    tail: bool = True  # open1b: the tail rules (deadline, speculative slots; node/planner.py plan)
    diversity: bool = True  # open1b: prefer a class that has not matched a step for its later replays

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}")
        if self.redundancy > self.nodes:
            raise ValueError("redundancy needs at least that many nodes")
        if self.adversary not in ("lazy", "liar"):
            raise ValueError("adversary must be lazy or liar")
        if self.view not in ("overlay", "exact"):
            raise ValueError("view must be overlay or exact")
        if self.start_s and (len(self.start_s) != self.nodes or self.churn is not None):
            raise ValueError("start_s needs one time per node, and no churn")

    def replace(self, **changes) -> "Scenario":
        return dataclasses.replace(self, **changes)

    def describe(self) -> dict:
        return {
            "nodes": self.nodes, "steps": self.steps, "redundancy": self.redundancy, "strategy": self.strategy,
            "mix": describe(self.mix), "network": dataclasses.asdict(self.network), "lease_s": self.lease_s,
            "idle_poll_s": self.idle_poll_s, "churn": dataclasses.asdict(self.churn) if self.churn else None,
            "adversary_share": self.adversary_share, "adversary": self.adversary, "forged_steps": self.forged_steps,
            "segment": self.segment, "seed": self.seed, "crypto": self.crypto, "view": self.view,
            "parking": self.parking, "start_s": list(self.start_s), "tail": self.tail, "diversity": self.diversity,
            "class_capacity": class_capacity(self.mix),
        }


def node_rng(seed: int, node: int, stream: str) -> random.Random:
    return random.Random(f"{seed}/{node}/{stream}")


class Population:
    """Hardware, behaviour and the online/offline schedule of every node."""

    def __init__(self, sc: Scenario, loop: EventLoop, join: Callable[[int], None], leave: Callable[[int], None]) -> None:
        self.sc, self.loop, self._join, self._leave = sc, loop, join, leave
        self.hardware: list[Hardware] = assign(sc.mix, sc.nodes, sc.seed)
        bad = round(sc.adversary_share * sc.nodes)
        chosen = set(random.Random(f"{sc.seed}/adversaries").sample(range(sc.nodes), bad))
        self.behaviour = [sc.adversary if i in chosen else "honest" for i in range(sc.nodes)]
        self.online = [False] * sc.nodes
        self._churn = [node_rng(sc.seed, i, "churn") for i in range(sc.nodes)] if sc.churn else []

    def start(self) -> None:
        churn = self.sc.churn
        for i in range(self.sc.nodes):
            if churn is None:
                self.online[i] = True
                if self.sc.start_s:
                    self.loop.call_at(self.sc.start_s[i], self._join, i)
                else:
                    self._join(i)
                continue
            rng = self._churn[i]
            if rng.random() < churn.availability:
                self.online[i] = True
                self._join(i)
                self.loop.call_at(rng.expovariate(1 / churn.mean_online_s), self._flip, i)
            else:
                self.loop.call_at(rng.expovariate(1 / churn.mean_offline_s), self._flip, i)

    def _flip(self, i: int) -> None:
        churn, rng = self.sc.churn, self._churn[i]
        assert churn is not None
        self.online[i] = not self.online[i]
        if self.online[i]:
            self._join(i)
            self.loop.call_at(self.loop.now + rng.expovariate(1 / churn.mean_online_s), self._flip, i)
        else:
            self._leave(i)
            self.loop.call_at(self.loop.now + rng.expovariate(1 / churn.mean_offline_s), self._flip, i)


def forged_steps(sc: Scenario) -> frozenset[int]:
    return frozenset(random.Random(f"{sc.seed}/forged").sample(range(sc.steps), sc.forged_steps))


def summary(sc: Scenario, tracker, loop: EventLoop, *, in_flight: int, aborted: int, wasted_s: float,
            extra: dict, wall_s: float) -> dict:
    ideal = sc.steps * sc.redundancy
    spent = tracker.replays + in_flight
    t = tracker.time_full
    return {
        "scenario": sc.describe(),
        "complete": tracker.done,
        "time_to_full_s": round(t, 1) if t is not None else None,
        "time_to_full_h": round(t / HOUR, 3) if t is not None else None,
        "replays_attested": tracker.replays,
        "replays_in_flight_at_end": in_flight,
        "two_class_share": round(tracker.two_class_share(), 4),
        "replays": spent,
        "replay_ratio": round(spent / ideal, 4),
        "replays_by": tracker.replays_by,
        "aborted_replays": aborted,
        "aborted_replay_hours": round(wasted_s / HOUR, 1),
        "steps_touched_at_end": tracker.touched,
        "detection": tracker.detection(),
        "curve": [(round(a / HOUR, 4), round(b, 5), round(c, 5)) for a, b, c in tracker.curve],
        "events": loop.events,
        "wall_s": round(wall_s, 2),
        **extra,
    }
