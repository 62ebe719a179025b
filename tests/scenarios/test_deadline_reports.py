"""What the nat, straggler, late-joiner and device-classes scenarios say when they end without
what they wait for, on fake devnets (no daemons): the node, step or condition that was missing,
not the base's bare "done"."""

from __future__ import annotations

from types import SimpleNamespace

from open1b.devnet.options import DevnetOptions
from open1b.devnet.scenarios import _waiting_for, render
from open1b.devnet.scenarios.base import Node
from open1b.devnet.scenarios.device_classes import DECLARED, DeviceClasses
from open1b.devnet.scenarios.late_joiner import NOT_STARTED, LateJoiner, differences
from open1b.devnet.scenarios.nat import Nat
from open1b.devnet.scenarios.straggler import STRAGGLE_S, Straggler

RUN = "ab" * 32


def step(k: int, status: str = "verified", auditors: tuple[str, ...] = ("p1", "p2"), devices: tuple[str, ...] = ()):
    return {"step": k, "status": status, "auditors": list(auditors), "dissenters": [], "claimants": [],
            "evidence": [], "devices": list(devices), "fraud_proofs": []}


class FakeNet:
    """A devnet of ``nodes`` whose observer (node 0) holds ``per_step`` (complete, so the only
    thing missing is the scenario's own event) and answers ``answers`` by path."""

    run = RUN
    observer = 0

    def __init__(self, nodes: list[Node], per_step: list[dict], answers: dict | None = None) -> None:
        self.nodes, self.per_step, self.answers = nodes, per_step, answers or {}
        self.poll_at = 100.0
        self.started: list[int] = []
        self.daemons = SimpleNamespace(addrs=["/ip4/127.0.0.1/tcp/1"], start=lambda i, **kw: self.started.append(i))

    def coverage(self, i):
        return {"complete": True, "per_step": self.per_step, "flagged": [], "verified_steps": len(self.per_step),
                "disputed_steps": [], "refuted_steps": []}

    def get(self, i, path):
        if path == "/v1/status" and ("status", i) in self.answers:
            return self.answers["status", i]
        return self.answers[path]

    def attestations(self, i, step=None):
        return self.answers.get(("attestations", step), [])

    def running(self, i):
        return i in self.started or self.nodes[i].role != "late"

    def indices(self, *roles):
        return [i for i, n in enumerate(self.nodes) if n.role in roles]

    def honest(self):
        return self.indices("observer", "auditor")

    def peer(self, i):
        return f"peer-{i}"


def test_nat_past_its_deadline_names_the_home_nodes_without_a_reservation_and_the_homes_that_never_talked():
    nat = Nat(DevnetOptions(scenarios=("nat",)))
    nodes = [Node("observer", audit=False), Node("auditor", audit=True, site="internet"),
             Node("auditor", audit=True, site="a"), Node("auditor", audit=True, site="b"),
             Node("home-publisher", audit=False, site="a")]

    def status(i, peers, reserved):
        return {"peer_id": f"peer-{i}", "network": {"peers": {f"peer-{p}": "direct" for p in peers},
                                                     "reserved_on": reserved}}

    # home B's auditor holds no reservation; every node talked to the internet, no home to the other
    answers = {("status", 0): status(0, [1, 2, 3, 4], []), ("status", 1): status(1, [0, 2, 3, 4], []),
               ("status", 2): status(2, [0, 1], ["peer-0"]), ("status", 3): status(3, [0, 1], []),
               ("status", 4): status(4, [0, 1], ["peer-0"])}
    net = FakeNet(nodes, [step(0)], answers)
    assert _waiting_for(net, [nat]) == [f"nat: {nat.waiting}: no node's connections read yet"]
    nat.tick(net)
    assert not nat.done(net)
    assert _waiting_for(net, [nat]) == ["nat: a relay reservation on auditor 3 (home b); homes A and B to talk"
                                        " (no connection between them in 7 pairs seen)"]
    answers["status", 3] = status(3, [0, 1, 2], ["peer-0"])  # reserved, and talked to home A
    nat.tick(net)  # too soon after the last read: nothing changes
    assert not nat.done(net)
    net.poll_at += 60
    nat.tick(net)
    assert nat.done(net) and _waiting_for(net, [nat]) == []


def test_straggler_past_its_deadline_names_the_steps_it_claimed_and_did_not_attest():
    straggler = Straggler(DevnetOptions(scenarios=("straggler",)))
    nodes = [Node("observer", audit=False), Node("auditor", audit=True), *straggler.nodes()]
    answers = {f"/v1/claims/{RUN}": []}
    net = FakeNet(nodes, [step(0), step(1)], answers)
    straggler.tick(net)
    assert _waiting_for(net, [straggler]) == [
        "straggler: the straggler (node 2) to claim a step: the observer has shown none of its claims"]
    claim = {"step": 1, "slot": 0, "claimant": "peer-2", "issued_at": 10, "expected_done": 10 + STRAGGLE_S}
    answers[f"/v1/claims/{RUN}"] = [claim, {**claim, "claimant": "peer-1", "slot": 2}]
    straggler.tick(net)
    answers["attestations", 1] = [{"signer": "peer-1", "verdict": "match", "received_at_ms": 1}]
    assert _waiting_for(net, [straggler]) == [
        "straggler: the straggler's (node 2) own attestation, at the observer, of a step it claimed: [1]"]
    answers["attestations", 1].append({"signer": "peer-2", "verdict": "match", "received_at_ms": 2})
    assert straggler.done(net) and _waiting_for(net, [straggler]) == []


def test_a_late_joiner_never_started_says_so_and_one_that_disagreed_names_the_steps():
    late = LateJoiner(DevnetOptions(scenarios=("late-joiner",)))
    nodes = [Node("observer", audit=False), Node("auditor", audit=True), *late.nodes()]
    net = FakeNet(nodes, [step(0), step(1)], {("status", 2): {"replays": 0}})
    report = late.report(net)  # the run was never covered: after() was not called
    assert not report["ok"] and report["missing"] == [NOT_STARTED]
    assert f"missing   {NOT_STARTED}" in render(_summary({"late-joiner": report}))

    behind = {**net.coverage(0), "per_step": [step(0), step(1, "claimed", ("p1",))], "complete": False}
    assert differences(behind, net.coverage(0)) == ["step 1: claimed by 1 here, verified by 2 at the observer",
                                                    "complete False here, True at the observer"]
    assert differences(net.coverage(0), net.coverage(0)) == []

    late.after(net)  # the fake late node holds what the observer holds: same at the first read
    report = late.report(net)
    assert net.started == [2] and report["ok"] and report["missing"] == []


def test_device_classes_names_the_steps_one_class_matched():
    classes = DeviceClasses(DevnetOptions(scenarios=("device-classes",)))
    per_step = [step(0, devices=("cpu/x86", DECLARED)), step(1, auditors=("p1",), devices=("cpu/x86",))]
    report = classes.report(FakeNet([Node("observer", audit=False)], per_step))
    assert not report["ok"]
    assert report["missing"] == ["step 1: matched by cpu/x86", "step 1: 1 auditor(s)"]
    report = classes.report(FakeNet([Node("observer", audit=False)], per_step[:1]))
    assert report["ok"] and report["missing"] == []


def _summary(reports: dict) -> dict:
    return {"run": RUN, "steps": 2, "redundancy": 1, "nodes": 3, "wall_seconds": 1.0, "verified_steps": 2,
            "disputed_steps": [], "refuted_steps": [], "complete": True, "converged": True, "lost": 0,
            "scenarios": reports}
