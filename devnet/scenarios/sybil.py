"""``sybil``: fresh keys attest every step at once; the default trust policy must not count them."""

from __future__ import annotations

from .base import Node, Scenario, _result

SYBIL_KEYS = 20


class Sybil(Scenario):
    name = "sybil"
    waiting = f"all {SYBIL_KEYS} fresh keys reported untrusted at the observer"

    def nodes(self):
        return [Node("sybil", audit=False, args=("--behaviour", f"sybil={SYBIL_KEYS}")),
                Node("open-observer", audit=False, args=("--trust-policy", "open"))]

    def done(self, net):
        return len(net.coverage(net.observer)["untrusted"]) >= SYBIL_KEYS

    def report(self, net):
        cov = net.coverage(net.observer)
        open_cov = net.coverage(net.indices("open-observer")[0])
        members = {net.peer(i) for i in range(len(net.nodes))}  # the devnet's own keys, each trusted
        counted = {p for s in cov["per_step"] for p in s["auditors"] + s["dissenters"]}
        per_step_open = min(len(set(s["auditors"] + s["dissenters"])) for s in open_cov["per_step"])
        per_step = max(len(set(s["auditors"] + s["dissenters"])) for s in cov["per_step"])
        # Under `open` the fresh keys count, unless the proof of replay caught them: their made-up
        # witness bindings fail any step's reveal (another scenario's copier makes honest nodes
        # reveal witnesses), and then they are flagged copiers in every step.
        caught = {f["signer"] for f in open_cov["flagged"] if f["kind"] == "copier"} & set(cov["untrusted"])
        return _result(
            {"what": "fresh keys attesting every step at once", "count": SYBIL_KEYS,
             "attestations": SYBIL_KEYS * net.manifest.steps},
            {"what": "keys not counted under the default policy", "count": len(cov["untrusted"]),
             "max_attesters_per_step": per_step, "min_attesters_per_step_under_open": per_step_open,
             "caught_as_copiers_under_open": len(caught)},
            0,
            {"no fresh key counted": counted <= members and len(cov["untrusted"]) == SYBIL_KEYS,
             "honest coverage still complete": cov["complete"],
             "under `open` every fresh key inflates coverage or is caught as a copier":
                 per_step_open + len(caught) >= SYBIL_KEYS})
