"""``straggler``: one auditor replays far slower than the others and says so (``straggler=S``:
its claims carry an ``expected_done`` S seconds out). Near the tail, idle fast auditors re-claim
its step on the speculative slot (docs/protocol.md §10.1) and cover it first; its own replay
arrives later and counts once, like every other: nothing is lost or counted twice."""

from __future__ import annotations

from .base import Node, Scenario, _result

STRAGGLE_S = 90  # about twice what the fast auditors take for the whole tiny run: its step is the last


class Straggler(Scenario):
    name = "straggler"
    min_redundancy = 2
    min_auditors = 3  # fast ones: besides the straggler, enough for two per step and a third to speculate
    waiting = "the straggler's own attestation, at the observer, of a step it claimed"

    def __init__(self, opts):
        super().__init__(opts)
        self.claims: dict[tuple[int, int, str, int], dict] = {}  # (step, slot, claimant, issued_at) -> claim

    def nodes(self):
        return [Node("auditor", audit=True, args=("--behaviour", f"straggler={STRAGGLE_S}"))]

    @staticmethod
    def _index(net) -> int:
        return next(i for i, n in enumerate(net.nodes) if f"straggler={STRAGGLE_S}" in n.args)

    def _straggler(self, net) -> str:
        return net.peer(self._index(net))

    def tick(self, net):
        # Every live claim the observer holds, while it is live (a claim stays live until its lease ends).
        for c in net.get(net.observer, f"/v1/claims/{net.run}"):
            self.claims.setdefault((c["step"], c["slot"], c["claimant"], c["issued_at"]), c)

    def _held(self, net) -> set[int]:
        me = self._straggler(net)
        return {c["step"] for c in self.claims.values() if c["claimant"] == me}

    def done(self, net):
        # Until the straggler's own replay of a step it held arrived: that it counts once is the point.
        me = self._straggler(net)
        return any(a["signer"] == me for k in self._held(net) for a in net.attestations(net.observer, k))

    def still_waiting(self, net) -> str:
        i = self._index(net)
        held = sorted(self._held(net))
        if not held:
            return f"the straggler (node {i}) to claim a step: the observer has shown none of its claims"
        return f"the straggler's (node {i}) own attestation, at the observer, of a step it claimed: {held}"

    def report(self, net):
        me, r = self._straggler(net), net.get(net.observer, f"/v1/coverage/{net.run}")["redundancy"]
        held = self._held(net)
        speculative = [c for c in self.claims.values() if c["slot"] >= r and c["step"] in held and c["claimant"] != me]
        cov = net.coverage(net.observer)
        per_step, raced = {}, []
        for s in cov["per_step"]:
            atts = net.attestations(net.observer, s["step"])
            signers = [a["signer"] for a in atts if a["verdict"] == "match"]
            per_step[s["step"]] = {"auditors": s["auditors"], "match_signers": sorted(set(signers)),
                                   "attestations": len(atts)}
            if s["step"] in held and me in signers:
                first = min(atts, key=lambda a: a["received_at_ms"])
                raced.append({"step": s["step"], "first": first["signer"],
                              "straggler_after_s": round((max(a["received_at_ms"] for a in atts if a["signer"] == me)
                                                          - first["received_at_ms"]) / 1000, 1)})
        counted_once = all(len(p["auditors"]) == len(set(p["auditors"])) == len(p["match_signers"])
                           for p in per_step.values())
        return _result(
            {"what": f"auditor {me[-8:]} replays {STRAGGLE_S} s slower and declares it",
             "count": 1, "steps_held": sorted(held),
             "expected_done_in_s": sorted({c["expected_done"] - c["issued_at"] for c in self.claims.values()
                                          if c["claimant"] == me and c["expected_done"] is not None})},
            {"what": "speculative re-claims of the straggler's steps", "count": len(speculative),
             "claims": [{"step": c["step"], "slot": c["slot"], "claimant": c["claimant"],
                         "expected_done_in_s": (c["expected_done"] - c["issued_at"])
                         if c["expected_done"] is not None else None} for c in speculative],
             "raced": raced},
            0,
            {"the straggler held a step": bool(held),
             "a fast auditor re-claimed it on the speculative slot": bool(speculative),
             "a fast auditor attested it before the straggler": bool(raced) and all(x["first"] != me for x in raced),
             "every attester counted once": counted_once},
            per_step={str(k): v for k, v in per_step.items()})
