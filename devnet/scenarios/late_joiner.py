"""``late-joiner``: a node started after the run is covered must report the same coverage as the others."""

from __future__ import annotations

import time

from open1b.node.client import ApiUnavailable

from .base import CONVERGE_TIMEOUT_S, POLL_S, Node, Scenario, _result, canonical


class LateJoiner(Scenario):
    name = "late-joiner"

    def __init__(self, opts):
        super().__init__(opts)
        self.seconds: float | None = None
        self.same = False

    def nodes(self):
        return [Node("late", audit=True, late=True)]

    def after(self, net):
        i = net.indices("late")[0]
        net.daemons.start(i, audit=True, bootstrap=[net.daemons.addrs[0]])
        started = time.monotonic()
        while time.monotonic() - started < CONVERGE_TIMEOUT_S:
            try:  # the others may still be adding statements: compare with what they hold now
                if canonical(net.coverage(i)) == canonical(net.coverage(net.observer)):
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
            {"reports the same coverage": self.same})
