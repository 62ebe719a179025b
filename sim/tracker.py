"""What every strategy is measured by: coverage over time, replays, detection of forged steps.

A step is *covered* when it has at least ``redundancy`` distinct attesters (``Coverage.complete``
per step), or ``redundancy + 1`` once disputed — a disputed step wants one more opinion, and
one more than it has while its matches and mismatches tie (``planner.wanted``) — in every
strategy alike. A run is covered when every step is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from open1b.node import planner


@dataclass
class Tracker:
    steps: int
    redundancy: int
    forged: frozenset[int] = frozenset()
    curve_points: int = 200
    attesters: dict[int, set[bytes]] = field(default_factory=dict)
    disputed: set[int] = field(default_factory=set)
    matchers: dict[int, set[bytes]] = field(default_factory=dict)  # step -> keys that matched it
    satisfied: int = 0
    touched: int = 0  # steps with at least one attester
    replays: int = 0
    replays_by: dict[str, int] = field(default_factory=dict)
    time_full: float | None = None
    detected: dict[int, float] = field(default_factory=dict)  # forged step -> first mismatch
    false_disputes: int = 0
    curve: list[tuple[float, float, float]] = field(default_factory=list)
    devices: dict[int, set[str]] = field(default_factory=dict)  # step -> device classes that matched it

    def __post_init__(self) -> None:
        self._next_marks = [0, 0]  # next curve point: when touched or satisfied reaches these

    def _wanted(self, step: int) -> int:
        # In the simulator one step's mismatches all report one post_state (zeros from a liar, or
        # the honest replay of a forged step), so matches and mismatches are its only two tallies.
        n, matched = len(self.attesters.get(step, ())), len(self.matchers.get(step, ()))
        return planner.wanted(step in self.disputed, self.redundancy, n, planner.tied((matched, n - matched)))

    def add(self, step: int, signer: bytes, match: bool, t: float, kind: str = "honest",
            device: str | None = None) -> None:
        self.replays += 1
        if match and device is not None:
            self.devices.setdefault(step, set()).add(device)
        self.replays_by[kind] = self.replays_by.get(kind, 0) + 1
        atts = self.attesters.setdefault(step, set())
        before = len(atts) >= self._wanted(step)
        if not atts:
            self.touched += 1
        atts.add(signer)
        if match:
            self.matchers.setdefault(step, set()).add(signer)
        if not match and step not in self.disputed:
            self.disputed.add(step)
            if step in self.forged:
                self.detected[step] = t
            else:
                self.false_disputes += 1
        after = len(atts) >= self._wanted(step)
        self.satisfied += int(after) - int(before)
        marks = [(n * self.curve_points) // self.steps for n in (self.touched, self.satisfied)]
        if any(m >= n for m, n in zip(marks, self._next_marks)) or self.satisfied == self.steps:
            self.curve.append((t, self.touched / self.steps, self.satisfied / self.steps))
            self._next_marks = [m + 1 for m in marks]
        if self.satisfied == self.steps and self.time_full is None:
            self.time_full = t

    @property
    def done(self) -> bool:
        return self.satisfied == self.steps

    def want(self, step: int) -> int:
        """Attesters ``step`` still wants (ignoring work in progress)."""
        return self._wanted(step) - len(self.attesters.get(step, ()))

    def two_class_share(self) -> float:
        """The share of steps matched by at least two device classes."""
        return sum(1 for d in self.devices.values() if len(d) >= 2) / self.steps

    def detection(self) -> dict:
        times = sorted(self.detected.values())
        n = len(self.forged)

        def q(p: float) -> float | None:
            return round(times[min(len(times) - 1, int(p * len(times)))] / 3600, 3) if times else None

        return {"forged_steps": n, "detected": len(times), "undetected": n - len(times),
                "hours_to_detect_p50": q(0.5), "hours_to_detect_p90": q(0.9), "hours_to_detect_max": q(1.0),
                "false_disputes": self.false_disputes}
