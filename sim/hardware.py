"""How long one replay takes on a volunteer's machine.

The classes carry the incumbent's published replay times for one step of the 1.6B-parameter
Open-1B run (docs/scale.md, "Assumptions"): H100 under an hour, RTX 3090/4090 about 1–1.5 h, a
48 GB MacBook about 6 h and a 24 GB one about 18 h. Which share of volunteers owns what is our
assumption, not a measurement; every experiment records the mix it used.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

HOUR = 3600.0


@dataclass(frozen=True)
class Hardware:
    name: str
    seconds: float  # typical time to replay one step
    jitter: float = 0.1  # each replay takes seconds × U(1 − jitter, 1 + jitter)
    samples: tuple[float, ...] = ()  # if given: replay times drawn from these (measured) instead
    device: str = "cpu/sim"  # the device class its attestations name (protocol DEVICE_CLASS)

    def replay_seconds(self, rng: random.Random) -> float:
        if self.samples:
            return rng.choice(self.samples)
        return self.seconds * rng.uniform(1 - self.jitter, 1 + self.jitter)


H100 = Hardware("H100", 0.8 * HOUR, device="cuda/sm_90")
RTX4090 = Hardware("RTX 4090", 1.0 * HOUR, device="cuda/sm_89")
RTX3090 = Hardware("RTX 3090", 1.5 * HOUR, device="cuda/sm_86")
MAC48 = Hardware("MacBook 48 GB", 6.0 * HOUR, device="cpu/arm64")
MAC24 = Hardware("MacBook 24 GB", 18.0 * HOUR, device="cpu/arm64")
CPU_SERVER = Hardware("CPU server", 80.0 * HOUR, device="cpu/x86_64")

# An assumed volunteer population: mostly gaming GPUs and laptops, a few data-centre GPUs.
VOLUNTEER_MIX: tuple[tuple[Hardware, float], ...] = (
    (H100, 0.10), (RTX4090, 0.25), (RTX3090, 0.25), (MAC48, 0.25), (MAC24, 0.15),
)


# Heterogeneity sweep (docs/scale.md, "The tail"): every node alike, and a 100× spread of speeds.
EQUAL_MIX: tuple[tuple[Hardware, float], ...] = ((RTX4090, 1.0),)
SPREAD_MIX: tuple[tuple[Hardware, float], ...] = (
    (H100, 0.25), (RTX3090, 0.25), (MAC48, 0.25), (CPU_SERVER, 0.25),
)
MIXES = {"equal": EQUAL_MIX, "incumbent": VOLUNTEER_MIX, "spread-100x": SPREAD_MIX}


def class_capacity(mix: Sequence[tuple[Hardware, float]]) -> dict[str, float]:
    """Each device class's share of the replays per hour the mix can do."""
    rate: dict[str, float] = {}
    for hw, share in mix:
        rate[hw.device] = rate.get(hw.device, 0.0) + share / hw.seconds
    total = sum(rate.values())
    return {device: round(r / total, 4) for device, r in sorted(rate.items())}


def assign(mix: Sequence[tuple[Hardware, float]], nodes: int, seed: int) -> list[Hardware]:
    """Hardware for each of ``nodes`` nodes: the mix's shares exactly (largest remainders), in a
    seeded random order, so that small populations do not drift from the stated mix."""
    total = sum(share for _, share in mix)
    quotas = [nodes * share / total for _, share in mix]
    counts = [int(q) for q in quotas]
    for i in sorted(range(len(mix)), key=lambda i: counts[i] - quotas[i])[: nodes - sum(counts)]:
        counts[i] += 1
    out = [hw for (hw, _), n in zip(mix, counts) for _ in range(n)]
    random.Random(seed).shuffle(out)
    return out


def describe(mix: Sequence[tuple[Hardware, float]]) -> list[dict]:
    return [{"hardware": hw.name, "share": share, "replay_hours": round(hw.seconds / HOUR, 4), "device": hw.device,
             "measured_samples": len(hw.samples)} for hw, share in mix]
