"""``crash``: ``kill -9`` of a third of the auditors mid-replay; their leases expire, others retake
the steps, and the restarted nodes lose nothing."""

from __future__ import annotations

import time

from ..daemons import say
from .base import Scenario, _result


class Crash(Scenario):
    name = "crash"
    min_auditors = 3
    LEASE_S = 5
    waiting = "a third of the auditors killed mid-replay, and each killed step attested by another"

    def __init__(self, opts):
        super().__init__(opts)
        self.killed: dict[int, dict] = {}  # index -> {step, peer, before: digests, at}
        self.restarted_ok: dict[int, bool] = {}

    def auditor_args(self):
        return ("--behaviour", "slow=2", "--lease", str(self.LEASE_S))

    def _want(self, net) -> int:
        return max(1, len(net.indices("auditor")) // 3)

    def tick(self, net):
        if len(self.killed) >= self._want(net):
            return
        # Only nodes that know the run: an auditor learns it by sync while the run is still being
        # provided (minutes, under load), and until then its API answers 404 for the run, which ended
        # the whole poll, every scenario's tick with it (a second devnet beside: 218 polls in a row,
        # at least 109 s). Such a node has signed nothing of the run yet, so it is not a candidate.
        candidates = [i for i in net.indices("auditor") if i not in self.killed and self._knows_run(net, i)]
        # What each has signed, read first: between reading that a node is replaying and killing it
        # there must be nothing but the kill, or the replay may finish and attest in between (its
        # step is then covered and never retaken).
        signed = {i: {a["digest"] for a in net.attestations(i) if a["signer"] == net.peer(i)} for i in candidates}
        for i in sorted(i for i in candidates if signed[i]):  # with attestations of its own: what a restart must keep
            if len(self.killed) == self._want(net):
                break
            step = net.get(i, "/v1/status")["replaying_step"]
            if step is None:
                continue
            net.daemons.kill(i)
            net.forget_api(i)
            self.killed[i] = {"step": step, "peer": net.peer(i), "before": signed[i], "at": time.time()}
            say(f"crash: kill -9 of node {i} while replaying step {step}")

    @staticmethod
    def _knows_run(net, i) -> bool:
        return any(r["run"] == net.run for r in net.get(i, "/v1/runs"))

    def done(self, net):
        if len(self.killed) < self._want(net):
            return False
        cov = net.coverage(net.observer)
        return all(set(cov["per_step"][k["step"]]["auditors"] + cov["per_step"][k["step"]]["dissenters"]) - {k["peer"]}
                   for k in self.killed.values())

    def after(self, net):
        for i in self.killed:
            net.daemons.start(i, audit=True, bootstrap=[net.daemons.addrs[net.observer]], extra_args=self._args(net, i))
        for i, k in self.killed.items():
            mine = {a["digest"] for a in net.attestations(i) if a["signer"] == k["peer"]}
            self.restarted_ok[i] = k["before"] <= mine
            k["after"] = len(mine)

    def _args(self, net, i):
        return net.nodes[i].args

    def report(self, net):
        retaken = {}
        for i, k in self.killed.items():
            times = [a["received_at_ms"] / 1000 for a in net.attestations(net.observer, k["step"])
                     if a["signer"] != k["peer"]]
            retaken[str(k["step"])] = round(min(times) - k["at"], 1) if times else None
        lost = sum(len(k["before"]) for i, k in self.killed.items() if not self.restarted_ok.get(i))
        return _result(
            {"what": "kill -9 of auditors mid-replay", "count": len(self.killed),
             "of": len(net.indices("auditor")), "steps": [k["step"] for k in self.killed.values()]},
            {"what": "killed steps retaken by others after the lease", "count": sum(1 for v in retaken.values() if v),
             "retake_seconds": retaken},
            lost,
            {"a third of the auditors killed mid-replay": len(self.killed) == self._want(net),
             "every killed step retaken": bool(retaken) and all(v is not None for v in retaken.values()),
             "restarted nodes lost no attestation": bool(self.restarted_ok) and all(self.restarted_ok.values())},
            attestations_before_kill={str(i): len(k["before"]) for i, k in self.killed.items()})
