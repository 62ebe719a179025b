"""``partition``: the network is split into two halves (Linux network namespaces, :mod:`..netns`);
each keeps working, and both converge after healing."""

from __future__ import annotations

import time
from enum import StrEnum

from ..daemons import say
from .base import Node, Scenario, _result, canonical


class Phase(StrEnum):
    CONNECTED = "connected"
    SPLIT = "split"
    HEALED = "healed"
    CONVERGED = "converged"


class Partition(Scenario):
    name = "partition"
    min_auditors = 4
    # With slow replays, enough steps that the halves still have work when the split comes, after
    # every publisher has provided the run (see tick)
    min_steps = 16
    # How long a half may take to attest alone before the scenario heals the split and fails. Each
    # half's second attestation came within 18 s of the split in bench/reliability.py's runs;
    # before silent peers were set aside (node/peer_liveness.py) a loaded half made none in 480 s.
    SPLIT_LIMIT_S = 240.0
    SLOW_S = 3  # each replay takes this much longer: the run must not be covered before every publisher is done
    MIN_MADE = 2  # attestations each half must make on its own (or complete its coverage) before healing
    waiting = "the split (a quarter covered), two attestations in each half, the heal, and every node's coverage alike"

    def __init__(self, opts):
        super().__init__(opts)
        self.state = Phase.CONNECTED
        self.times: dict[str, float] = {}
        self.halves_complete: list[bool] = [False, False]
        self.made: list[int] = [0, 0]
        self.after_split: list[list[float]] = [[], []]  # seconds from the split to each of a half's attestations
        self.verified_at_split: int | None = None
        self.partition = None  # netns.Partition, set by run_scenarios

    def nodes(self):
        return [Node("observer-b", audit=False, half=1)]

    def publishers(self, net):
        # The trainer seeds both halves: a half whose only source of checkpoints is cut off can
        # audit nothing (data availability is not what this scenario measures).
        return self._observers(net)[1:]

    def auditor_args(self):
        # Leases claimed before the split by the other half block a slot until they end: short
        # ones keep the halves from waiting minutes (docs/reliability.md, "Findings").
        # Slow replays leave work for the halves: auditors start while the run is being published,
        # and the split waits for every publisher (see tick).
        return ("--behaviour", f"slow={self.SLOW_S}", "--lease", "10")

    def _observers(self, net):
        return [net.observer, net.indices("observer-b")[0]]

    def tick(self, net):
        now = time.monotonic()
        if self.state is Phase.CONNECTED:
            # Not before every publisher has provided the run: the driver publishes one after the
            # other, so a split during the first publish leaves the second half's seed unpublished
            # until after the heal (CI saw a half make nothing for the whole split).
            # And not before a quarter of the run is covered: split sooner, with the auditors' first
            # DHT walks and fetches still crossing, a loaded half made no attestation in 240 s.
            cov = net.coverage(net.observer)
            if net.published_at is not None and cov["verified_steps"] + len(cov["disputed_steps"]) >= self.min_steps // 4:
                self.partition.split()
                self.times["split"] = now
                self.verified_at_split = net.coverage(net.observer)["verified_steps"]
                self.state = Phase.SPLIT
                say("partition: the network is split in two halves")
        elif self.state is Phase.SPLIT:
            covs = [net.coverage(o) for o in self._observers(net)]
            self.halves_complete = [c["complete"] for c in covs]
            self.after_split = [self._made_since_split(net, h) for h in (0, 1)]
            self.made = [len(times) for times in self.after_split]
            working = all(c or m >= self.MIN_MADE for c, m in zip(self.halves_complete, self.made))
            if working or now - self.times["split"] > self.SPLIT_LIMIT_S:
                self.partition.heal()
                self.times["heal"] = now
                self.state = Phase.HEALED
                say(f"partition: healed after {now - self.times['split']:.1f} s")
        elif self.state is Phase.HEALED:
            covs = [canonical(net.coverage(i)) for i in net.honest()]
            if all(c == covs[0] for c in covs):
                self.times["converged"] = now
                self.state = Phase.CONVERGED

    def _made_since_split(self, net, half: int) -> list[float]:
        """When (seconds after the split) each attestation made during the split by this half's
        nodes reached the half's own observer, in order."""
        members = {net.peer(i) for i, n in enumerate(net.nodes) if n.half == half}
        observer = self._observers(net)[half]
        since = (time.time() - (time.monotonic() - self.times["split"])) * 1000
        return sorted(round((a["received_at_ms"] - since) / 1000, 1) for a in net.attestations(observer)
                      if a["signer"] in members and a["received_at_ms"] >= since)

    def done(self, net):
        return self.state is Phase.CONVERGED

    def report(self, net):
        t = self.times
        return _result(
            {"what": "network split into two halves, then healed", "count": 1 if "split" in t else 0,
             "split_seconds": round(t["heal"] - t["split"], 1) if "heal" in t else None,
             "verified_steps_at_split": self.verified_at_split,
             "halves": [sum(1 for n in net.nodes if n.half == h) for h in (0, 1)]},
            {"what": "attestations each half made alone; identical coverage after healing",
             "count": sum(self.made), "attestations_made_per_half": self.made,
             # the first may come from a replay under way at the split; the later ones were claimed while split
             "first_attestation_after_split_s": [times[0] if times else None for times in self.after_split],
             "attestations_after_split_s": self.after_split,
             "halves_complete_alone": self.halves_complete,
             "converged_seconds_after_heal": round(t["converged"] - t["heal"], 1) if "converged" in t else None},
            0,
            {"both halves kept working": all(c or m >= self.MIN_MADE for c, m in zip(self.halves_complete, self.made)),
             "identical coverage after healing": "converged" in t})
