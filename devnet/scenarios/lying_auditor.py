"""``lying-auditor``: trusted nodes that sign without replaying must be flagged by independent
replays and stop counting."""

from __future__ import annotations

from open1b.protocol import Attestation

from .base import Node, Scenario, _result
from .fraud_proofs import conviction

# How a liar is caught: two conflicting signed statements settled by replays, or, where a node's
# dispute with it ended in a fraud proof, a conviction, which replaces any other flag (§8.3).
CAUGHT = ("contradiction", "fraud")


class LyingAuditor(Scenario):
    """Two trusted liars that never replay: one vouches ``match`` for every step (a forged one
    included), one disputes every step with a made-up result. Independent replays must settle
    each step against them: both flagged, each with two conflicting signed statements."""

    name = "lying-auditor"
    min_redundancy = 2  # at redundancy 1 a fast liar alone "covers" every step: nobody replays it
    needs_forgery = True
    ROLES = ("liar", "accuser")
    waiting = "both liars flagged for a contradiction or convicted by a fraud proof at the observer"
    LEASE_S = 20  # longer than a replay on a loaded machine, so that leases rarely end mid-replay

    def auditor_args(self):
        # Honest keys get flagged too, for a while: a copier (copying-auditor) that copies the
        # accuser's false mismatch makes two keys against one honest replay, which is out-voted
        # until a second honest replay of that step ties it. Meanwhile the flagged honest key's
        # attestations stop counting, so its claims look unfinished and hold their slots until the
        # lease ends and a new round begins: with the default 120-s lease a loaded machine took
        # 283 s to settle (docs/reliability.md, "Findings"). Short leases bound that wait.
        return ("--lease", str(self.LEASE_S))

    def nodes(self):
        # They claim nothing: a flagged key's live claim would hold its slot until the lease ends
        # (docs/reliability.md, "Findings").
        return [Node("liar", audit=False, args=("--behaviour", "lie")),
                Node("accuser", audit=False, args=("--behaviour", "lie=mismatch"))]

    def _liars(self, net) -> dict[str, str]:
        return {role: net.peer(net.indices(role)[0]) for role in self.ROLES}

    def done(self, net):
        # A liar's made-up witness bindings may get it flagged a copier first (docs/run-format.md
        # §5); once a forged step settles, its flag carries the contradiction this scenario checks,
        # unless a dispute convicted it first.
        flagged = {f["signer"] for f in net.coverage(net.observer)["flagged"] if f["kind"] in CAUGHT}
        return set(self._liars(net).values()) <= flagged

    def report(self, net):
        liars = self._liars(net)
        honest = {net.peer(i) for i in net.indices("auditor", "late")}
        cov = net.coverage(net.observer)
        flags = {f["signer"]: f for f in cov["flagged"]}
        lies = sum(1 for a in net.attestations(net.observer) if a["signer"] in liars.values())
        evidence, conflicts = {}, {}
        for role, liar in liars.items():
            flag = flags.get(liar)
            pair = []
            if flag is not None and flag["kind"] == "fraud":
                proof = conviction(net, flag, liar)
                conflicts[role] = proof is not None
                evidence[role] = [proof.hex()] if proof else []
                continue
            if flag is not None:
                held = {a["digest"]: a for a in net.attestations(net.observer, flag["step"])}
                pair = [held[d]["encoded"] for d in (flag["statement"], flag["conflicting"]) if d in held]
            atts = [Attestation.decode(bytes.fromhex(e)) for e in pair]
            conflicts[role] = (len(atts) == 2 and atts[0].signer_peer_id == liar and atts[0].step == atts[1].step
                               and atts[0].pre_state == atts[1].pre_state and atts[0].post_state != atts[1].post_state
                               and atts[1].signer_peer_id in honest)  # cites an honest replay, not the other liar
            evidence[role] = pair
        counted = {p for s in cov["per_step"] for p in s["auditors"] + s["dissenters"]}
        return _result(
            {"what": "statements signed without replaying (a match and a false dispute per step)", "count": lies},
            {"what": "liars flagged with two conflicting signed statements, or convicted by a fraud proof",
             "count": len(set(liars.values()) & set(flags)),
             "flagged_at_steps": {role: flags[p]["step"] for role, p in liars.items() if p in flags}},
            0,
            {"both liars flagged": set(liars.values()) <= set(flags),
             "evidence: an honest replay conflicts with each, or a proof convicts it": all(conflicts.values()),
             "liars no longer counted": not counted & set(liars.values()),
             "coverage complete without them": cov["complete"]},
            liars=liars, evidence=evidence)
