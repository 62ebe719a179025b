"""The crash scenario's choice of whom to kill, on a fake devnet (no daemons): an auditor that has
not learnt the run yet is passed over, not an error that ends the poll."""

from __future__ import annotations

from open1b.devnet.options import DevnetOptions
from open1b.devnet.scenarios.crash import Crash
from open1b.node.client import ApiUnavailable


class FakeNet:
    """Three auditors (so one is to be killed): 0 has not learnt the run, and its API answers 404
    for it as a node's does; 1 knows it, has attested one step and is replaying step 3; 2 knows it
    and has signed nothing."""

    run = "ab" * 32

    def __init__(self):
        self.killed: list[int] = []
        self.daemons = self

    def indices(self, *roles):
        return [0, 1, 2] if "auditor" in roles else []

    def peer(self, i):
        return f"peer-{i}"

    def attestations(self, i):
        if i == 0:
            raise ApiUnavailable(f"127.0.0.1:1/v1/attestations/{self.run}: HTTP 404 no single known run matches")
        return [{"digest": "d1", "signer": "peer-1"}] if i == 1 else []

    def get(self, i, path):
        if path == "/v1/runs":
            return [] if i == 0 else [{"run": self.run}]
        if path == "/v1/status":
            return {"replaying_step": 3 if i == 1 else None}
        raise ApiUnavailable(f"HTTP 404 {path}")

    def kill(self, i):
        self.killed.append(i)

    def forget_api(self, i):
        pass


def test_an_auditor_that_does_not_know_the_run_yet_is_passed_over():
    scenario, net = Crash(DevnetOptions()), FakeNet()
    scenario.tick(net)
    assert net.killed == [1]
    assert scenario.killed[1]["step"] == 3 and scenario.killed[1]["before"] == {"d1"}
