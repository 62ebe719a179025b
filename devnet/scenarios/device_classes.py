"""``device-classes``: as many auditors again as the devnet has, each declaring the device class
``cuda/sm_90`` for its replays (``device=cuda/sm_90``: the CPU computes the same bits). With the
class preference and the class wait (docs/protocol.md §10.1) a step's second replay goes to the
class that has not matched it: a node leaves the last slot of a step only its own class matched
or replays to the other class (busy for a moment at this size) for a few turnarounds at most, and
since r21 every claim names its claimant's class, so the class of a replay in flight is known
before its claimant has attested anything. Issue 30 asks for every step matched by both classes:
a check."""

from __future__ import annotations

from .base import Node, Scenario, _result

DECLARED = "cuda/sm_90"


class DeviceClasses(Scenario):
    name = "device-classes"
    min_redundancy = 2

    def nodes(self):
        return [Node("auditor", audit=True, args=("--behaviour", f"device={DECLARED}"))
                for _ in range(max(self.opts.nodes, self.min_auditors))]

    def report(self, net):
        cov = net.coverage(net.observer)
        classes = {s["step"]: sorted(set(s["devices"])) for s in cov["per_step"]}
        both = [k for k, d in classes.items() if len(d) >= 2 and DECLARED in d]
        return _result(
            {"what": f"auditors declaring {DECLARED}", "count": max(self.opts.nodes, self.min_auditors)},
            {"what": "steps matched by both classes", "count": len(both), "of": len(classes)},
            0,
            {"the run's classes are two": len({d for ds in classes.values() for d in ds}) == 2,
             "every step covered at redundancy 2": all(len(s["auditors"]) >= 2 for s in cov["per_step"]),
             "every step matched by both classes": len(both) == len(classes)},
            every_step_both=len(both) == len(classes), classes={str(k): v for k, v in classes.items()},
            missing=[f"step {k}: matched by {', '.join(d) or 'no class'}" for k, d in classes.items() if k not in both]
            + [f"step {s['step']}: {len(s['auditors'])} auditor(s)" for s in cov["per_step"] if len(s["auditors"]) < 2])
