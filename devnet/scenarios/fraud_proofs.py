"""Scenarios of fraud proofs (docs/protocol.md §18): a forged op, a false accusation.

``forged-op``: the trainer forged one op of one step (one bit of one ``gelu`` output, and the
published state follows from it). An auditor's replay mismatches; the auditor and the trainer
bisect their traces over the dispute stream (devnet/disputer.py plays both: the daemons do not
run disputes yet) and the fraud proof, gossiped into the devnet, must make every honest node
refute the step without a vote, citing the proof, which names the forged op."""

from __future__ import annotations

from open1b.node.identity_file import load_identity
from open1b.protocol.dispute import verify_fraud_proof
from open1b.protocol.hashing import blake2b256

from ..disputer import dispute, gossip_proof, party
from ..forged_op import FORGED_KIND, ForgingBackend
from .base import Node, Scenario, _result


class _Dispute(Scenario):
    """A scenario around one dispute over the middle step: its result and the facts reported."""

    min_steps = 2

    def __init__(self, opts) -> None:
        super().__init__(opts)
        self.step = opts.steps // 2
        self.result = None
        self.facts: dict = {}


class ForgedOp(_Dispute):
    name = "forged-op"

    def forgeries(self):
        return {self.step: "forged-op"}

    def prepare_run(self, run_dir, manifest, publisher, auditors):
        self.run_dir, self.trainer, self.auditor = run_dir, publisher, auditors[0]
        return manifest

    def _status(self, net, i: int) -> dict:
        return net.coverage(i)["per_step"][self.step]

    def tick(self, net):
        if self.result is not None or self._status(net, net.observer)["status"] not in ("disputed", "refuted"):
            return  # no auditor has replayed the forged step yet
        honest = party(self.run_dir, net.manifest, self.step, self.auditor, None)
        forger = party(self.run_dir, net.manifest, self.step, self.trainer, ForgingBackend)
        self.result, wall = dispute((self.auditor, honest), (self.trainer, forger))
        self.facts = {"rounds": self.result.rounds, "bisection_wall_s": round(wall, 3), "ops": len(honest.records),
                      "dissenters_before_the_proof": len(self._status(net, net.observer)["dissenters"])}
        if self.result.proof is None:
            return
        digest = blake2b256(self.result.proof).hex()
        listed = lambda: any(p["digest"] == digest for p in net.get(net.observer, f"/v1/disputes/{net.run}"))  # noqa: E731
        self.facts["stored_after_s"] = round(gossip_proof(self.result.proof, net.manifest.run_id,
                                                          net.daemons.addrs[net.observer], listed), 2)

    def done(self, net):
        return self.result is not None and (self.result.proof is None or all(
            self._status(net, i)["fraud_proofs"] for i in net.honest()))

    def report(self, net):
        result = self.result
        verdict = verify_fraud_proof(result.proof) if result is not None and result.proof else None
        digest = blake2b256(result.proof).hex() if verdict else None
        statuses = {net.peer(i): self._status(net, i) for i in net.honest()}
        others = [s for s in net.coverage(net.observer)["per_step"] if s["step"] != self.step]
        return _result(
            {"what": f"one op forged at step {self.step} (a bit of a {FORGED_KIND} output)", "count": 1,
             "step": self.step},
            {"what": "a fraud proof from a bisection, checked by every node's referee",
             "count": int(verdict is not None and verdict.accepted), "op": verdict.op if verdict else None,
             "position": verdict.position if verdict else None, "proof_bytes": len(result.proof) if verdict else None,
             "outcome": result.outcome if result else None, **self.facts},
            0,
            {"the bisection ended in a proof": verdict is not None,
             "the proof names the forged op": verdict is not None and verdict.op == FORGED_KIND,
             "the referee convicts the trainer": verdict is not None and verdict.guilty == (net.manifest.publisher,),
             "every honest node refutes the step citing the proof": all(
                 s["status"] == "refuted" and s["fraud_proofs"] == [digest] for s in statuses.values()),
             "every other step verified": all(s["status"] == "verified" for s in others)},
            proof=result.proof.hex() if verdict else None)


class FalseAccusation(_Dispute):
    """``false-accusation``: a trusted auditor that signs a mismatch of every step without replaying
    stands by it in a dispute with the honest trainer, with a trace that forges one op (the only
    way to a different h_{k+1} from the same h_k). The bisection's proof convicts the accuser, not
    the trainer: every honest node flags it (``fraud``) and the step stays verified."""

    name = "false-accusation"

    def nodes(self):
        return [Node("accuser", audit=False, args=("--behaviour", "lie=mismatch"))]

    def prepare_run(self, run_dir, manifest, publisher, auditors):
        self.run_dir, self.trainer = run_dir, publisher
        return manifest

    def tick(self, net):
        accuser = net.peer(net.indices("accuser")[0])
        if self.result is not None or accuser not in net.coverage(net.observer)["per_step"][self.step]["dissenters"]:
            return  # the accusation has not reached the observer yet
        liar = load_identity(net.daemons.dirs[net.indices("accuser")[0]])
        trainer = party(self.run_dir, net.manifest, self.step, self.trainer, None)
        accusing = party(self.run_dir, net.manifest, self.step, liar, ForgingBackend)
        self.result, wall = dispute((liar, accusing), (self.trainer, trainer))
        self.facts = {"rounds": self.result.rounds, "bisection_wall_s": round(wall, 3)}
        if self.result.proof is not None:
            digest = blake2b256(self.result.proof).hex()
            listed = lambda: any(p["digest"] == digest for p in net.get(net.observer, f"/v1/disputes/{net.run}"))  # noqa: E731
            self.facts["stored_after_s"] = round(gossip_proof(self.result.proof, net.manifest.run_id,
                                                              net.daemons.addrs[net.observer], listed), 2)

    def _fraud_flag(self, net, i: int) -> dict | None:
        accuser = net.peer(net.indices("accuser")[0])
        return next((f for f in net.coverage(i)["flagged"] if f["signer"] == accuser and f["kind"] == "fraud"), None)

    def done(self, net):
        return self.result is not None and (self.result.proof is None or all(
            self._fraud_flag(net, i) for i in net.honest()))

    def report(self, net):
        result = self.result
        verdict = verify_fraud_proof(result.proof) if result is not None and result.proof else None
        digest = blake2b256(result.proof).hex() if verdict else None
        accuser = load_identity(net.daemons.dirs[net.indices("accuser")[0]])
        flags = [self._fraud_flag(net, i) for i in net.honest()]
        cov = net.coverage(net.observer)
        return _result(
            {"what": f"a false mismatch of step {self.step}, defended in a dispute with a forged op", "count": 1,
             "step": self.step},
            {"what": "a fraud proof convicting the accuser", "count": int(verdict is not None and verdict.accepted),
             "op": verdict.op if verdict else None, "proof_bytes": len(result.proof) if verdict else None,
             "outcome": result.outcome if result else None, **self.facts},
            0,
            {"the bisection ended in a proof": verdict is not None,
             "the referee convicts the accuser, not the trainer": verdict is not None
             and verdict.guilty == (accuser.public_key,),
             "every honest node flags the accuser for fraud, citing the proof": all(
                 f is not None and f["statement"] == digest for f in flags),
             "no step refuted": not cov["refuted_steps"]},
            proof=result.proof.hex() if verdict else None)
