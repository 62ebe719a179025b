"""``copying-auditor``: a node that re-signs others' attestations without replaying must be
flagged and stop counting."""

from __future__ import annotations

from open1b.protocol import MATCH, Attestation, Open1bError, WitnessReveal
from open1b.protocol.witness import witness_binding, witness_commitment

from .base import HONEST_ROLES, Node, Scenario, _result
from .fraud_proofs import conviction


class CopyingAuditor(Scenario):
    """A trusted node re-signs other nodes' attestations, every field copied (the witness binding
    included), without replaying. An honest replayer of a copied step that finds the copy's binding
    wrong for its signer reveals the step's witness W_k; every node then flags the copier
    (docs/run-format.md §5) and stops counting it.

    Combined with ``lying-auditor``, the copier may copy a liar's false statement first; coverage
    then flags it for a ``contradiction`` (docs/protocol.md §8.2: its statement conflicts with the
    settled post-state) rather than as a ``copier``. The check expects what coverage says: either
    flag, each with the evidence its kind calls for."""

    name = "copying-auditor"
    waiting = "the copier to have copied a result for every step and be flagged at the observer"

    def nodes(self):
        return [Node("copier", audit=False, args=("--behaviour", "copy"))]

    def done(self, net):  # it has copied a result for every step, and the observer caught it
        return self._sent(net) >= net.manifest.steps and self._flag(net) is not None

    def _sent(self, net) -> int:
        i = net.indices("copier")[0]
        return sum(1 for a in net.attestations(i) if a["signer"] == net.peer(i))

    def _flag(self, net) -> dict | None:
        copier = net.peer(net.indices("copier")[0])
        return next((f for f in net.coverage(net.observer)["flagged"] if f["signer"] == copier), None)

    def report(self, net):
        copier = net.peer(net.indices("copier")[0])
        cov = net.coverage(net.observer)
        flag = self._flag(net)
        counted = sorted(s["step"] for s in cov["per_step"] if copier in s["auditors"] + s["dissenters"])
        reveals = {r["digest"]: r for r in net.get(net.observer, f"/v1/reveals/{net.run}")}
        evidence: dict[str, str] = {}
        if flag is not None:
            held = {a["digest"]: a for a in net.attestations(net.observer, flag["step"])}
            found = {"statement": held.get(flag["statement"]), "conflicting": held.get(flag["conflicting"])}
            if flag["kind"] == "copier":
                found["reveal"] = reveals.get(flag["reveal"])
            evidence = {k: v["encoded"] for k, v in found.items() if v is not None}
        copied_a_lie = flag is not None and flag["kind"] == "contradiction"
        proven = _contradiction_proven if copied_a_lie else _copy_proven
        how = "for a contradiction (it copied a false statement)" if copied_a_lie else "by a witness reveal"
        as_what = "for a contradiction" if copied_a_lie else "as a copier"
        if flag is not None and flag["kind"] == "fraud":  # a dispute convicted it: the proof is the evidence
            proof = conviction(net, flag, copier)
            evidence = {"proof": proof.hex()} if proof else {}
            how = as_what = "by a fraud proof"
            proven = lambda *_: proof is not None  # noqa: E731
        honest = {net.peer(i) for i in net.indices(*HONEST_ROLES)}
        sent = self._sent(net)
        return _result(
            {"what": "attestations copied from other nodes without replaying", "count": sent},
            {"what": f"copiers flagged {how}", "count": int(bool(evidence)), "kind": flag["kind"] if flag else None,
             "flagged_at_step": flag["step"] if flag else None, "reveals": len(reveals), "counted_steps": counted},
            0,
            {f"copier flagged {as_what}": flag is not None and flag["kind"] in ("copier", "contradiction", "fraud"),
             "evidence re-checks": proven(evidence, net.manifest, flag["step"] if flag else -1, copier),
             "copies not counted": sent > 0 and not counted,
             "no honest node flagged": not honest & {f["signer"] for f in cov["flagged"]}},
            copier=copier, evidence=evidence)


def _copy_proven(evidence: dict[str, str], manifest, step: int, copier: str) -> bool:
    """Re-check a copier's evidence from its bytes alone: the reveal opens the manifest's C_step,
    the copier's match binds another witness, and another key's match binds the revealed one."""
    try:
        mine = Attestation.decode(bytes.fromhex(evidence["statement"]))
        other = Attestation.decode(bytes.fromhex(evidence["conflicting"]))
        reveal = WitnessReveal.decode(bytes.fromhex(evidence["reveal"]))
    except (KeyError, ValueError, Open1bError):
        return False
    w = reveal.witness
    return (reveal.run == mine.run == other.run == manifest.run_id and reveal.step == mine.step == other.step == step
            and witness_commitment(w) == manifest.witnesses[step] and mine.signer_peer_id == copier
            and mine.verdict == other.verdict == MATCH and other.signer_peer_id != copier
            and mine.witness != witness_binding(mine.run, step, mine.signer, w)
            and other.witness == witness_binding(other.run, step, other.signer, w))


def _contradiction_proven(evidence: dict[str, str], manifest, step: int, copier: str) -> bool:
    """Re-check a contradiction flag from its bytes alone: the copier's statement and another key's
    are about the same step from the same pre-state, and report different post-states."""
    try:
        mine = Attestation.decode(bytes.fromhex(evidence["statement"]))
        other = Attestation.decode(bytes.fromhex(evidence["conflicting"]))
    except (KeyError, ValueError, Open1bError):
        return False
    return (mine.run == other.run == manifest.run_id and mine.step == other.step == step
            and mine.pre_state == other.pre_state == manifest.state_hashes[step]
            and mine.post_state != other.post_state
            and mine.signer_peer_id == copier and other.signer_peer_id != copier)
