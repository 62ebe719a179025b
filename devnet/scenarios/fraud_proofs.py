"""Scenarios of fraud proofs (docs/protocol.md §18): the daemons' own disputes.

``forged-op``: the trainer forged one op of one step (one bit of one ``gelu`` output, and the
published state follows from it) and stands by it in a dispute (``--behaviour forger``: its
traces are the forged computation). An auditor's replay mismatches; the daemons dispute the step
over the dispute stream (node/dispute_agent.py), and the fraud proof, stored and gossiped by the
node that found it, must make every honest node refute the step without a vote, citing the
proof, which names the forged op.

``false-accusation``: a trusted auditor that signs a mismatch of every step without replaying
stands by it in disputes, with traces that forge one op (the only way to a different h_{k+1} from
the same h_k). The daemons' proof convicts the accuser, not the trainer: every honest node flags
it (``fraud``) and no step is refuted.

``silent-disputant`` and ``oversized-disputant``: the forged-op trainer answers a dispute with its
trace and then says nothing more (``forger=silent``), or sends a frame over the bound
(``forger=oversized``); it opens none (``--no-disputes``). The auditor's dispute ends
``peer_silent`` after its round timeout (a few seconds here, ``--dispute-round-seconds``; the
spec's is 60 s), or ``peer_malformed`` with the trainer penalised; no proof exists, so the step
stays disputed (one dissenter, no quorum)."""

from __future__ import annotations

import urllib.request

from open1b.node.identity_file import load_identity
from open1b.protocol.dispute import FraudProof, verify_fraud_proof
from open1b.protocol.hashing import blake2b256
from open1b.protocol.identity import public_key_from_peer_id

from ..forged_op import FORGED_KIND
from .base import Node, Scenario, _result

ROUND_S = 3.0  # the devnet's dispute round timeout (--dispute-round-seconds)


def _fetch_proof(net, i: int, digest: str) -> bytes:
    with urllib.request.urlopen(f"http://{net.api(i)}/v1/disputes/{net.run}/{digest}", timeout=10) as answer:
        return answer.read()


def conviction(net, flag: dict, signer: str) -> bytes | None:
    """The proof a ``fraud`` flag (a conviction, docs/protocol.md §8.3 step 9) cites, as the
    observer serves it, if it is that proof and the referee convicts ``signer`` with it."""
    try:
        proof = _fetch_proof(net, net.observer, flag["statement"])
    except OSError:
        return None
    verdict = verify_fraud_proof(proof)
    convicted = (blake2b256(proof).hex() == flag["statement"] and verdict.accepted
                 and public_key_from_peer_id(signer) in verdict.guilty)
    return proof if convicted else None


def _recent(net, i: int, outcome: str) -> list[dict]:
    return [d for d in net.get(i, "/v1/status")["disputes"]["recent"] if d["outcome"] == outcome]


class _Dispute(Scenario):
    """A scenario around the daemons' disputes over the middle step: the proof the observer holds
    convicting ``guilty`` there, and the dispute that found it."""

    min_steps = 2

    def __init__(self, opts) -> None:
        super().__init__(opts)
        self.step = opts.steps // 2
        self.proof: bytes | None = None
        self.facts: dict = {}

    def auditor_args(self) -> tuple[str, ...]:
        return ("--dispute-round-seconds", str(ROUND_S))

    def guilty(self, net) -> str:
        raise NotImplementedError

    def tick(self, net):
        if self.proof is not None:
            return
        found = [p for p in net.get(net.observer, f"/v1/disputes/{net.run}") if self.guilty(net) in p["guilty"]]
        if not found:
            return  # no dispute has ended in a proof the observer holds yet
        self.proof = _fetch_proof(net, net.observer, found[0]["digest"])
        self.facts["stored_at_observer_s"] = net.elapsed()
        found_by = [d for i in net.indices("auditor", "observer", "accuser") if net.running(i)
                    for d in _recent(net, i, "proof") if d["proof_bytes"] == len(self.proof)]
        if found_by:  # the dispute's own measure, as the node that held it saw it
            self.facts.update({"rounds": found_by[0]["rounds"], "dispute_s": found_by[0]["seconds"],
                               "found_by": found_by[0]["role"]})
        self.facts["ops"] = FraudProof.decode(self.proof).traces[0].ops

    def verdict(self):
        return verify_fraud_proof(self.proof) if self.proof is not None else None

    def detected(self, what: str) -> dict:
        verdict = self.verdict()
        return {"what": what, "count": int(verdict is not None and verdict.accepted),
                "op": verdict.op if verdict else None, "position": verdict.position if verdict else None,
                "proof_bytes": len(self.proof) if verdict else None, **self.facts}


class ForgedOp(_Dispute):
    name = "forged-op"
    waiting = "a fraud proof convicting the trainer at the observer, and every honest node citing one and the same proof"

    def forgeries(self):
        return {self.step: "forged-op"}

    def observer_args(self) -> tuple[str, ...]:
        return ("--behaviour", "forger")

    def guilty(self, net) -> str:
        return net.peer(net.observer)

    def _status(self, net, i: int) -> dict:
        return net.coverage(i)["per_step"][self.step]

    def _cited(self, net) -> set[tuple[str, ...]]:
        return {tuple(self._status(net, i)["fraud_proofs"]) for i in net.honest()}

    def done(self, net):
        # Both parties of the dispute build a proof (each its own trace first), and a node keeps the
        # lower digest of the two (§18.7): done once every honest node cites one and the same proof,
        # which need not be the one the observer held first.
        cited = self._cited(net)
        return self.proof is not None and len(cited) == 1 and len(next(iter(cited))) == 1

    def report(self, net):
        cited = self._status(net, net.observer)["fraud_proofs"]
        if self.proof is not None and cited and cited[0] != blake2b256(self.proof).hex():
            self.proof = _fetch_proof(net, net.observer, cited[0])  # the proof the nodes settled on
        verdict = self.verdict()
        digest = blake2b256(self.proof).hex() if verdict else None
        statuses = {net.peer(i): self._status(net, i) for i in net.honest()}
        others = [s for s in net.coverage(net.observer)["per_step"] if s["step"] != self.step]
        detected = self.detected("a fraud proof from the daemons' dispute, checked by every node's referee")
        detected["dissenters"] = len(self._status(net, net.observer)["dissenters"])
        return _result(
            {"what": f"one op forged at step {self.step} (a bit of a {FORGED_KIND} output)", "count": 1,
             "step": self.step},
            detected, 0,
            {"the dispute ended in a proof": verdict is not None,
             "the proof names the forged op": verdict is not None and verdict.op == FORGED_KIND,
             "the referee convicts the trainer": verdict is not None and verdict.guilty == (net.manifest.publisher,),
             "every honest node refutes the step citing the proof": all(
                 s["status"] == "refuted" and s["fraud_proofs"] == [digest] for s in statuses.values()),
             "every other step verified": all(s["status"] == "verified" for s in others)},
            proof=self.proof.hex() if verdict else None)


class FalseAccusation(_Dispute):
    name = "false-accusation"
    waiting = "a fraud proof convicting the accuser at the observer, and the accuser flagged for fraud at every honest node"

    def nodes(self):
        return [Node("accuser", audit=False, args=("--behaviour", "lie=mismatch"))]

    def guilty(self, net) -> str:
        return net.peer(net.indices("accuser")[0])

    def _fraud_flag(self, net, i: int) -> dict | None:
        return next((f for f in net.coverage(i)["flagged"] if f["signer"] == self.guilty(net) and f["kind"] == "fraud"),
                    None)

    def done(self, net):
        return self.proof is not None and all(self._fraud_flag(net, i) for i in net.honest())

    def report(self, net):
        verdict = self.verdict()
        accuser = load_identity(net.daemons.dirs[net.indices("accuser")[0]])
        flags = [self._fraud_flag(net, i) for i in net.honest()]
        # the flag cites the proof of a conviction each node holds (any step the accuser lied about)
        cited = {i: {p["digest"] for p in net.get(i, f"/v1/disputes/{net.run}") if self.guilty(net) in p["guilty"]}
                 for i in net.honest()}
        cov = net.coverage(net.observer)
        return _result(
            {"what": "a false mismatch of every step, defended in disputes with a forged op", "count": 1,
             "step": self.step},
            self.detected("a fraud proof convicting the accuser"), 0,
            {"the dispute ended in a proof": verdict is not None,
             "the referee convicts the accuser, not the trainer": verdict is not None
             and verdict.guilty == (accuser.public_key,),
             "every honest node flags the accuser for fraud, citing a proof": all(
                 f is not None and f["statement"] in cited[i] for i, f in zip(net.honest(), flags)),
             "no step refuted": not cov["refuted_steps"]},
            proof=self.proof.hex() if verdict else None)


class _BadDisputant(_Dispute):
    """The forged-op trainer misbehaves in the dispute the auditor opens (``forger=HOW``), and
    opens none itself (``--no-disputes``): the auditor's dispute must end ``outcome`` (the node's
    own finding): no proof exists, so the step is settled by replays alone — disputed with one
    dissenter, or refuted where a quorum of auditors replayed it (``--nodes`` 3 and more)."""

    how = outcome = ""

    def __init__(self, opts) -> None:
        super().__init__(opts)
        self.ended: dict | None = None

    def forgeries(self):
        return {self.step: "forged-op"}

    def observer_args(self) -> tuple[str, ...]:
        return ("--behaviour", f"forger={self.how}", "--no-disputes")

    def tick(self, net):
        if self.ended is not None:
            return
        trainer = net.peer(net.observer)
        for i in net.indices("auditor"):
            ended = [d for d in _recent(net, i, self.outcome) if d["peer"] == trainer and d["role"] == "opened"]
            if ended:
                self.ended = {**ended[0], "auditor": i,
                              "penalties": net.get(i, "/v1/status")["penalties"].get(trainer, 0)}
                return

    def done(self, net):
        return self.ended is not None

    def checks(self, net) -> dict[str, bool]:
        step = net.coverage(net.observer)["per_step"][self.step]
        return {f"the auditor's dispute with the trainer ended {self.outcome}": self.ended is not None,
                "no fraud proof": all(not net.get(i, f"/v1/disputes/{net.run}") for i in net.honest()),
                "the step is disputed or refuted by replays, not by a proof":
                    step["status"] in ("disputed", "refuted") and not step["fraud_proofs"]}

    def report(self, net):
        return _result({"what": f"a forged-op trainer that is {self.how} in the dispute of step {self.step}",
                        "count": 1, "step": self.step},
                       {"what": f"the auditor's dispute ended {self.outcome}", "count": int(self.ended is not None),
                        **(self.ended or {})},
                       0, self.checks(net))


class SilentDisputant(_BadDisputant):
    """``silent-disputant``: the trainer answers with its trace, then says nothing: the auditor's
    dispute ends ``peer_silent`` once a round goes unanswered for the round timeout."""

    name, how, outcome = "silent-disputant", "silent", "peer_silent"
    waiting = "an auditor's dispute with the trainer to end peer_silent (a round unanswered for the round timeout)"

    def checks(self, net):
        return {**super().checks(net),
                "it waited out the round timeout": self.ended is not None and self.ended["seconds"] >= ROUND_S}


class OversizedDisputant(_BadDisputant):
    """``oversized-disputant``: the trainer's first message after its trace is a frame over the
    bound: the auditor's dispute ends ``peer_malformed`` at once and the trainer is penalised."""

    name, how, outcome = "oversized-disputant", "oversized", "peer_malformed"
    waiting = "an auditor's dispute with the trainer to end peer_malformed (a frame over the bound)"

    def checks(self, net):
        return {**super().checks(net), "the trainer is penalised": bool(self.ended and self.ended["penalties"] >= 1)}
