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

    def __init__(self, opts):
        super().__init__(opts)
        self.killed: dict[int, dict] = {}  # index -> {step, peer, before: digests, at}
        self.restarted_ok: dict[int, bool] = {}

    def auditor_args(self):
        return ("--behaviour", "slow=2", "--lease", str(self.LEASE_S))

    def tick(self, net):
        if self.killed:
            return
        auditors = net.indices("auditor")
        want = max(1, len(auditors) // 3)
        busy = {}
        for i in auditors:
            step = net.get(i, "/v1/status")["replaying_step"]
            # mid-replay, and with attestations of its own already stored: what a restart must keep
            if step is not None and any(a["signer"] == net.peer(i) for a in net.attestations(i)):
                busy[i] = step
        if len(busy) < want:
            return
        for i in sorted(busy)[:want]:
            before = {a["digest"] for a in net.attestations(i) if a["signer"] == net.peer(i)}
            net.daemons.kill(i)
            net.forget_api(i)
            self.killed[i] = {"step": busy[i], "peer": net.peer(i), "before": before, "at": time.time()}
        say(f"crash: kill -9 of node(s) {sorted(self.killed)} while replaying steps "
             f"{[k['step'] for k in self.killed.values()]}")

    def done(self, net):
        if not self.killed:
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
            {"a third of the auditors killed mid-replay": len(self.killed) == max(1, len(net.indices("auditor")) // 3),
             "every killed step retaken": bool(retaken) and all(v is not None for v in retaken.values()),
             "restarted nodes lost no attestation": bool(self.restarted_ok) and all(self.restarted_ok.values())},
            attestations_before_kill={str(i): len(k["before"]) for i, k in self.killed.items()})
