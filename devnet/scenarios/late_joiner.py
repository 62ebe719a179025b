"""``late-joiner``: a node started after the run is covered must report the same coverage as the others."""

from __future__ import annotations

import time

from open1b.node.client import ApiUnavailable

from .base import CONVERGE_TIMEOUT_S, POLL_S, Node, Scenario, _result, canonical

NOT_STARTED = "not started: the run was not covered before the deadline"


def differences(late: dict, observer: dict) -> list[str]:
    """Where the late node's coverage differs from the observer's, in what both must agree on."""
    a, b = canonical(late), canonical(observer)
    out = [f"step {x['step']}: {x['status']} by {len(x['auditors'])} here, {y['status']} by {len(y['auditors'])}"
           f" at the observer" for x, y in zip(a["per_step"], b["per_step"]) if x != y]
    if len(a["per_step"]) != len(b["per_step"]):
        out.append(f"{len(a['per_step'])} steps here, {len(b['per_step'])} at the observer")
    if a["flagged"] != b["flagged"]:
        out.append(f"{len(a['flagged'])} flagged here, {len(b['flagged'])} at the observer")
    if a["complete"] != b["complete"]:
        out.append(f"complete {a['complete']} here, {b['complete']} at the observer")
    return out


class LateJoiner(Scenario):
    name = "late-joiner"

    def __init__(self, opts):
        super().__init__(opts)
        self.seconds: float | None = None
        self.same = False
        # what still differed when the wait for the same coverage ended without it
        self.differing: list[str] = [NOT_STARTED]

    def nodes(self):
        return [Node("late", audit=True, late=True)]

    def after(self, net):
        i = net.indices("late")[0]
        net.daemons.start(i, audit=True, bootstrap=[net.daemons.addrs[0]])
        started = time.monotonic()
        self.differing = ["its coverage or the observer's never read (API unavailable)"]
        while time.monotonic() - started < CONVERGE_TIMEOUT_S:
            try:  # the others may still be adding statements: compare with what they hold now
                self.differing = differences(net.coverage(i), net.coverage(net.observer))
                if not self.differing:
                    self.same, self.seconds = True, round(time.monotonic() - started, 1)
                    return
            except ApiUnavailable:
                pass
            time.sleep(POLL_S)

    def report(self, net):
        i = net.indices("late")[0]
        replays = net.get(i, "/v1/status")["replays"] if net.running(i) else None
        return _result(
            {"what": "node started after the run was covered", "count": 1},
            {"what": "same coverage as the others", "count": int(self.same), "seconds": self.seconds,
             "its_replays": replays},
            0,
            {"reports the same coverage": self.same},
            missing=[] if self.same else self.differing)
