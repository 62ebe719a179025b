"""What a devnet that passed its deadline says the dispute scenarios still wait for, on a fake
devnet (no daemons): each names its own event, not the base's bare "done"."""

from __future__ import annotations

from open1b.devnet.options import DevnetOptions
from open1b.devnet.scenarios import TYPES, _waiting_for
from open1b.devnet.scenarios.base import Scenario
from open1b.devnet.scenarios.fraud_proofs import _Dispute

DISPUTES = [name for name, kind in TYPES.items() if issubclass(kind, _Dispute)]


class FakeNet:
    """A devnet whose observer's coverage is complete, and no dispute has ended yet."""

    run = "ab" * 32
    observer = 0

    def coverage(self, i):
        return {"complete": True, "per_step": [{"step": k, "fraud_proofs": []} for k in range(4)]}

    def honest(self):
        return [0, 1]

    def get(self, i, path):
        if path == f"/v1/disputes/{self.run}":
            return []
        return {"disputes": {"recent": []}}

    def indices(self, *roles):
        return [1] if "auditor" in roles else []

    def peer(self, i):
        return f"peer-{i}"


def test_a_dispute_scenario_past_its_deadline_names_what_it_still_waits_for():
    assert sorted(DISPUTES) == ["false-accusation", "forged-op", "oversized-disputant", "silent-disputant"]
    opts = DevnetOptions(scenarios=tuple(DISPUTES), steps=4)
    chosen = [TYPES[name](opts) for name in DISPUTES]
    for s in chosen:
        s.tick(FakeNet())  # nothing found: still waiting
    waiting = _waiting_for(FakeNet(), chosen)
    assert waiting == [f"{s.name}: {s.waiting}" for s in chosen]
    assert all(s.waiting != Scenario.waiting for s in chosen)  # its own event, named
