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

    def replay_seconds(self, rng: random.Random) -> float:
        if self.samples:
            return rng.choice(self.samples)
        return self.seconds * rng.uniform(1 - self.jitter, 1 + self.jitter)


H100 = Hardware("H100", 0.8 * HOUR)
RTX4090 = Hardware("RTX 4090", 1.0 * HOUR)
RTX3090 = Hardware("RTX 3090", 1.5 * HOUR)
MAC48 = Hardware("MacBook 48 GB", 6.0 * HOUR)
MAC24 = Hardware("MacBook 24 GB", 18.0 * HOUR)

# An assumed volunteer population: mostly gaming GPUs and laptops, a few data-centre GPUs.
VOLUNTEER_MIX: tuple[tuple[Hardware, float], ...] = (
    (H100, 0.10), (RTX4090, 0.25), (RTX3090, 0.25), (MAC48, 0.25), (MAC24, 0.15),
)


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
    return [{"hardware": hw.name, "share": share, "replay_hours": round(hw.seconds / HOUR, 4),
             "measured_samples": len(hw.samples)} for hw, share in mix]
