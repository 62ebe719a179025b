"""``open1b-node devnet --scenario NAME``: inject a fault or an adversary into a devnet of real
daemon processes and check that the network keeps its promises (docs/reliability.md).

A scenario adds nodes (honest or deliberately broken, :mod:`.adversary`), forges the published
run (:mod:`.forged_run`), acts while the run is being covered (kills, partitions) and after it
(restarts, late joiners), and reports what it injected, what the network detected and what was
lost. Scenarios combine: each adds its own nodes and actions to one devnet.

Every run also checks, whatever the scenarios: the observer's coverage completed; every honest
node ends with the same coverage (``converged``); and no honest attestation is missing from any
honest node (``lost``). Reports hold the signed evidence itself (hex-encoded statements), so a
test re-checks it without trusting the devnet's own judgement.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from open1b.protocol import MATCH, MISMATCH, Attestation, Identity, Open1bError, WitnessReveal
from open1b.protocol.witness import witness_binding, witness_commitment

from .adversary import INJECTED_FILE, SPAM_BURSTS
from .client import ApiUnavailable, call
from .devnet import SCENARIOS, Daemons, DevnetError, DevnetOptions

POLL_S = 0.5
CONVERGE_TIMEOUT_S = 45.0
LOST_GRACE_S = 15.0  # several sync rounds (every 2 s): enough for anything that was merely in flight
HONEST_ROLES = ("auditor", "observer", "observer-b", "late")  # one trust policy: their coverage must agree


@dataclass
class Node:
    role: str
    audit: bool
    args: tuple[str, ...] = ()
    late: bool = False  # started once the run is covered
    half: int = 0  # partition half


class Net:
    """The running devnet as scenarios see it: nodes by index, their APIs, and a clock."""

    def __init__(self, opts: DevnetOptions, manifest, daemons: Daemons, nodes: list[Node], started: float) -> None:
        self.opts, self.manifest, self.daemons, self.nodes, self.started = opts, manifest, daemons, nodes, started
        self.run = manifest.run_id.hex()
        self.observer = next(i for i, n in enumerate(nodes) if n.role == "observer")
        self._apis: dict[int, str] = {}

    def api(self, i: int) -> str:
        if i not in self._apis:
            self._apis[i] = self.daemons.api(i)
        return self._apis[i]

    def forget_api(self, i: int) -> None:
        self._apis.pop(i, None)

    def get(self, i: int, path: str) -> Any:
        return call(self.api(i), path)

    def coverage(self, i: int) -> dict:
        return self.get(i, f"/v1/coverage/{self.run}")

    def attestations(self, i: int, step: int | None = None) -> list[dict]:
        return self.get(i, f"/v1/attestations/{self.run}" + (f"?step={step}" if step is not None else ""))

    def running(self, i: int) -> bool:
        return i < len(self.daemons.procs) and self.daemons.procs[i].poll() is None

    def indices(self, *roles: str) -> list[int]:
        return [i for i, n in enumerate(self.nodes) if n.role in roles]

    def honest(self) -> list[int]:
        return [i for i in self.indices(*HONEST_ROLES) if self.running(i)]

    def peer(self, i: int) -> str:
        return self.daemons.peer_id(i)

    def elapsed(self) -> float:
        return round(time.monotonic() - self.started, 2)


def _say(line: str) -> None:
    print(f"devnet: {line}", file=sys.stderr, flush=True)


def canonical(cov: dict) -> dict:
    """What two nodes holding the same statements must agree on (live claims are only hints)."""
    return {"per_step": [{k: v for k, v in s.items() if k != "claimants"} for s in cov["per_step"]],
            "flagged": cov["flagged"], "complete": cov["complete"]}


def _verified_mismatch(encoded: str, manifest, step: int) -> bool:
    """Re-check one piece of evidence from its bytes alone: a validly signed mismatch about
    ``step`` that starts from the published h_step."""
    try:
        att = Attestation.decode(bytes.fromhex(encoded))
    except Open1bError:
        return False
    return (att.run == manifest.run_id and att.step == step and att.verdict == MISMATCH
            and att.pre_state == manifest.state_hashes[step] and att.post_state != manifest.state_hashes[step + 1])


class Scenario:
    name = ""
    min_redundancy = 1
    min_auditors = 1
    needs_forgery = False

    def __init__(self, opts: DevnetOptions) -> None:
        self.opts = opts

    def nodes(self) -> list[Node]:
        return []

    def auditor_args(self) -> tuple[str, ...]:
        return ()

    def publishers(self, net: Net) -> list[int]:
        """Nodes besides the observer that publish the run (each serves its files)."""
        return []

    def forgeries(self) -> dict[int, str]:
        return {}

    def tick(self, net: Net) -> None:
        """Called every poll until the run is covered and every scenario is done."""

    def done(self, net: Net) -> bool:
        return True

    def after(self, net: Net) -> None:
        """Called once the run is covered."""

    def report(self, net: Net) -> dict:
        raise NotImplementedError


def _result(injected: dict, detected: dict, lost: int, checks: dict[str, bool], **facts: Any) -> dict:
    return {"injected": injected, "detected": detected, "lost": lost, "checks": checks,
            "ok": all(checks.values()) and lost == 0, **facts}


# -- tampered-step -----------------------------------------------------------------------------
class TamperedStep(Scenario):
    name = "tampered-step"

    def forgeries(self) -> dict[int, str]:
        steps = self.opts.steps
        places = sorted({steps // 8, (3 * steps) // 8, (5 * steps) // 8})
        kinds = ["bitflip", "batch", "skip"] if steps >= 2 else ["bitflip"]
        return dict(zip(places, kinds))

    def done(self, net):
        return net.coverage(net.observer)["refuted_steps"] == sorted(self.forgeries())

    def report(self, net):
        forged = self.forgeries()
        cov = net.coverage(net.observer)
        evidence, valid, latency = {}, True, []
        for step in sorted(forged):
            held = {a["digest"]: a for a in net.attestations(net.observer, step)}
            listed = cov["per_step"][step]["evidence"]
            evidence[step] = [held[d]["encoded"] for d in listed if d in held]
            valid &= len(evidence[step]) == len(listed) >= 2
            valid &= all(_verified_mismatch(e, net.manifest, step) for e in evidence[step])
            times = sorted(held[d]["received_at_ms"] for d in listed if d in held)  # counted dissent only
            if len(times) >= 2:
                latency.append(times[1] - times[0])
        others = [s for s in cov["per_step"] if s["step"] not in forged]
        return _result(
            {"what": "forged published states", "count": len(forged), "steps": {str(k): v for k, v in forged.items()}},
            {"what": "steps refuted by independent replays", "count": len(cov["refuted_steps"]),
             "refuted": cov["refuted_steps"], "disputed": cov["disputed_steps"],
             "confirmed_within_ms": max(latency, default=None)},  # first counted mismatch -> second
            0,
            {"exactly the forged steps disputed": cov["disputed_steps"] == sorted(forged),
             "every forged step refuted": cov["refuted_steps"] == sorted(forged),
             "evidence re-checks": valid,
             "every other step verified": all(s["status"] == "verified" for s in others)},
            evidence=evidence)


# -- lying-auditor ---------------------------------------------------------------------------
class LyingAuditor(Scenario):
    """Two trusted liars that never replay: one vouches ``match`` for every step (a forged one
    included), one disputes every step with a made-up result. Independent replays must settle
    each step against them: both flagged, each with two conflicting signed statements."""

    name = "lying-auditor"
    min_redundancy = 2  # at redundancy 1 a fast liar alone "covers" every step: nobody replays it
    needs_forgery = True
    ROLES = ("liar", "accuser")

    def nodes(self):
        # They claim nothing: a flagged key's live claim would hold its slot until the lease ends
        # (docs/reliability.md, "Findings").
        return [Node("liar", audit=False, args=("--behaviour", "lie")),
                Node("accuser", audit=False, args=("--behaviour", "lie=mismatch"))]

    def _liars(self, net) -> dict[str, str]:
        return {role: net.peer(net.indices(role)[0]) for role in self.ROLES}

    def done(self, net):
        # A liar's made-up witness bindings may get it flagged a copier first (docs/run-format.md
        # §5); once a forged step settles, its flag carries the contradiction this scenario checks.
        flagged = {f["signer"] for f in net.coverage(net.observer)["flagged"] if f["kind"] == "contradiction"}
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
            {"what": "liars flagged with two conflicting signed statements",
             "count": len(set(liars.values()) & set(flags)),
             "flagged_at_steps": {role: flags[p]["step"] for role, p in liars.items() if p in flags}},
            0,
            {"both liars flagged": set(liars.values()) <= set(flags),
             "evidence: an honest replay conflicts with each": all(conflicts.values()),
             "liars no longer counted": not counted & set(liars.values()),
             "coverage complete without them": cov["complete"]},
            liars=liars, evidence=evidence)


# -- copying-auditor ---------------------------------------------------------------------------
class CopyingAuditor(Scenario):
    """A trusted node re-signs other nodes' attestations, every field copied (the witness binding
    included), without replaying. An honest replayer of a copied step that finds the copy's binding
    wrong for its signer reveals the step's witness W_k; every node then flags the copier
    (docs/run-format.md §5) and stops counting it."""

    name = "copying-auditor"

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
        if flag is not None and flag["kind"] == "copier":
            held = {a["digest"]: a for a in net.attestations(net.observer, flag["step"])}
            found = {"statement": held.get(flag["statement"]), "conflicting": held.get(flag["conflicting"]),
                     "reveal": reveals.get(flag["reveal"])}
            evidence = {k: v["encoded"] for k, v in found.items() if v is not None}
        honest = {net.peer(i) for i in net.indices(*HONEST_ROLES)}
        sent = self._sent(net)
        return _result(
            {"what": "attestations copied from other nodes without replaying", "count": sent},
            {"what": "copiers flagged by a witness reveal", "count": int(bool(evidence)),
             "flagged_at_step": flag["step"] if flag else None, "reveals": len(reveals), "counted_steps": counted},
            0,
            {"copier flagged as a copier": flag is not None and flag["kind"] == "copier",
             "evidence re-checks": _copy_proven(evidence, net.manifest, flag["step"] if flag else -1, copier),
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


# -- forged-and-malformed ----------------------------------------------------------------------
class ForgedAndMalformed(Scenario):
    name = "forged-and-malformed"

    def nodes(self):
        return [Node("spammer", audit=False, args=("--behaviour", "spam=3"))]

    def _index(self, net):
        return net.indices("spammer")[0]

    def done(self, net):
        path = net.daemons.dirs[self._index(net)] / INJECTED_FILE
        if not path.exists():
            return False
        spammer = net.peer(self._index(net))
        banned = [spammer in net.get(i, "/v1/status")["banned"] for i in net.honest() if not net.nodes[i].late]
        return all(banned) or json.loads(path.read_text())["bursts"] >= SPAM_BURSTS

    def report(self, net):
        i = self._index(net)
        spammer = net.peer(i)
        path = net.daemons.dirs[i] / INJECTED_FILE
        injected = json.loads(path.read_text())["injected"] if path.exists() else {}
        # honest nodes that were up while it spammed (a late joiner never heard it)
        statuses = {j: net.get(j, "/v1/status") for j in net.honest() if not net.nodes[j].late}
        seen: dict[str, int] = {}
        for st in statuses.values():
            for key, n in st["validation"].items():
                kind, outcome_code = key.split("/", 1)
                if kind in ("attestation", "sync"):
                    seen[outcome_code] = seen.get(outcome_code, 0) + n
        answered = {}
        for name, entry in injected.items():
            expect = entry["expect"]
            if expect == "reject/*":
                answered[name] = any(k.startswith("reject/") and n for k, n in seen.items())
            else:
                answered[name] = seen.get(expect, 0) > 0
        bad = {d for name, e in injected.items() if name != "replayed" for d in e["digests"]}
        stored = set()
        for j in net.honest():
            stored |= {a["digest"] for a in net.attestations(j)} & bad
        banned_by = sum(1 for st in statuses.values() if spammer in st["banned"])
        # Whoever refused a statement blamed its sender, and only its sender: honest peers forward
        # nothing invalid, so no honest node may ever be penalised.
        refused = [st for st in statuses.values() if any(k.startswith(("attestation/reject", "sync/reject"))
                                                          for k in st["validation"])]
        blamed = all(st["penalties"].get(spammer, 0) > 0 for st in refused)
        wrongly = {p for st in statuses.values() for p, n in st["penalties"].items() if p != spammer and n}
        alive = all(net.running(j) for j in range(len(net.daemons.procs)))
        return _result(
            {"what": "forged or malformed statements", "count": sum(e["count"] for e in injected.values()),
             "kinds": {k: e["count"] for k, e in injected.items()}},
            {"what": "refused with the specified outcome", "count": sum(n for k, n in seen.items()
                                                                         if k.startswith(("reject/", "ignore/"))),
             "by_code": dict(sorted(seen.items())), "banned_by": f"{banned_by}/{len(statuses)}"},
            len(stored),
            {"every kind answered as specified": bool(injected) and all(answered.values()),
             "nothing forged stored": not stored, "every node that refused one penalised its sender": blamed,
             "no honest peer penalised": not wrongly, "sender banned": banned_by > 0, "no daemon crashed": alive},
            answered=answered, spammer=spammer)


# -- sybil -------------------------------------------------------------------------------------
SYBIL_KEYS = 20


class Sybil(Scenario):
    name = "sybil"

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


# -- crash -------------------------------------------------------------------------------------
class Crash(Scenario):
    name = "crash"
    min_auditors = 3
    LEASE_S = 5

    def __init__(self, opts):
        super().__init__(opts)
        self.killed: dict[int, dict] = {}  # index -> {step, peer, before: digests, at}
        self.restarted_ok: dict[int, bool] = {}

    def auditor_args(self):
        return ("--behaviour", "slow=2", "--lease", str(self.LEASE_S))

    def tick(self, net):
        if self.killed:
            return
        auditors = net.indices("auditor")
        want = max(1, len(auditors) // 3)
        busy = {}
        for i in auditors:
            step = net.get(i, "/v1/status")["replaying_step"]
            # mid-replay, and with attestations of its own already stored: what a restart must keep
            if step is not None and any(a["signer"] == net.peer(i) for a in net.attestations(i)):
                busy[i] = step
        if len(busy) < want:
            return
        for i in sorted(busy)[:want]:
            before = {a["digest"] for a in net.attestations(i) if a["signer"] == net.peer(i)}
            net.daemons.kill(i)
            net.forget_api(i)
            self.killed[i] = {"step": busy[i], "peer": net.peer(i), "before": before, "at": time.time()}
        _say(f"crash: kill -9 of node(s) {sorted(self.killed)} while replaying steps "
             f"{[k['step'] for k in self.killed.values()]}")

    def done(self, net):
        if not self.killed:
            return False
        cov = net.coverage(net.observer)
        return all(set(cov["per_step"][k["step"]]["auditors"] + cov["per_step"][k["step"]]["dissenters"]) - {k["peer"]}
                   for k in self.killed.values())

    def after(self, net):
        for i in self.killed:
            net.daemons.start(i, audit=True, bootstrap=[net.daemons.addrs[net.observer]], extra_args=self._args(net, i))
        for i, k in self.killed.items():
            mine = {a["digest"] for a in net.attestations(i) if a["signer"] == k["peer"]}
            self.restarted_ok[i] = k["before"] <= mine
            k["after"] = len(mine)

    def _args(self, net, i):
        return net.nodes[i].args

    def report(self, net):
        retaken = {}
        for i, k in self.killed.items():
            times = [a["received_at_ms"] / 1000 for a in net.attestations(net.observer, k["step"])
                     if a["signer"] != k["peer"]]
            retaken[str(k["step"])] = round(min(times) - k["at"], 1) if times else None
        lost = sum(len(k["before"]) for i, k in self.killed.items() if not self.restarted_ok.get(i))
        return _result(
            {"what": "kill -9 of auditors mid-replay", "count": len(self.killed),
             "of": len(net.indices("auditor")), "steps": [k["step"] for k in self.killed.values()]},
            {"what": "killed steps retaken by others after the lease", "count": sum(1 for v in retaken.values() if v),
             "retake_seconds": retaken},
            lost,
            {"a third of the auditors killed mid-replay": len(self.killed) == max(1, len(net.indices("auditor")) // 3),
             "every killed step retaken": bool(retaken) and all(v is not None for v in retaken.values()),
             "restarted nodes lost no attestation": bool(self.restarted_ok) and all(self.restarted_ok.values())},
            attestations_before_kill={str(i): len(k["before"]) for i, k in self.killed.items()})


# -- partition ---------------------------------------------------------------------------------
class Partition(Scenario):
    name = "partition"
    min_auditors = 4
    SPLIT_LIMIT_S = 150.0
    MIN_MADE = 2  # attestations each half must make on its own (or complete its coverage) before healing

    def __init__(self, opts):
        super().__init__(opts)
        self.state = "connected"
        self.times: dict[str, float] = {}
        self.halves_complete: list[bool] = [False, False]
        self.made: list[int] = [0, 0]
        self.partition = None  # netns.Partition, set by run_scenarios

    def nodes(self):
        return [Node("observer-b", audit=False, half=1)]

    def publishers(self, net):
        # The trainer seeds both halves: a half whose only source of checkpoints is cut off can
        # audit nothing (data availability is not what this scenario measures).
        return self._observers(net)[1:]

    def auditor_args(self):
        # Leases claimed before the split by the other half block a slot until they end: short
        # ones keep the halves from waiting minutes (docs/reliability.md, "Findings").
        return ("--behaviour", "slow=1", "--lease", "10")

    def _observers(self, net):
        return [net.observer, net.indices("observer-b")[0]]

    def tick(self, net):
        now = time.monotonic()
        if self.state == "connected":
            if net.coverage(net.observer)["verified_steps"] + len(net.coverage(net.observer)["disputed_steps"]) >= 1:
                self.partition.split()
                self.times["split"] = now
                self.state = "split"
                _say("partition: the network is split in two halves")
        elif self.state == "split":
            covs = [net.coverage(o) for o in self._observers(net)]
            self.halves_complete = [c["complete"] for c in covs]
            self.made = [self._made_since_split(net, h) for h in (0, 1)]
            working = all(c or m >= self.MIN_MADE for c, m in zip(self.halves_complete, self.made))
            if working or now - self.times["split"] > self.SPLIT_LIMIT_S:
                self.partition.heal()
                self.times["heal"] = now
                self.state = "healed"
                _say(f"partition: healed after {now - self.times['split']:.1f} s")
        elif self.state == "healed":
            covs = [canonical(net.coverage(i)) for i in net.honest()]
            if all(c == covs[0] for c in covs):
                self.times["converged"] = now
                self.state = "converged"

    def _made_since_split(self, net, half: int) -> int:
        """Attestations made during the split by this half's nodes, as its own observer holds them."""
        members = {net.peer(i) for i, n in enumerate(net.nodes) if n.half == half}
        observer = self._observers(net)[half]
        since = (time.time() - (time.monotonic() - self.times["split"])) * 1000
        return sum(1 for a in net.attestations(observer) if a["signer"] in members and a["received_at_ms"] >= since)

    def done(self, net):
        return self.state == "converged"

    def report(self, net):
        t = self.times
        return _result(
            {"what": "network split into two halves, then healed", "count": 1 if "split" in t else 0,
             "split_seconds": round(t["heal"] - t["split"], 1) if "heal" in t else None,
             "halves": [sum(1 for n in net.nodes if n.half == h) for h in (0, 1)]},
            {"what": "attestations each half made alone; identical coverage after healing",
             "count": sum(self.made), "attestations_made_per_half": self.made,
             "halves_complete_alone": self.halves_complete,
             "converged_seconds_after_heal": round(t["converged"] - t["heal"], 1) if "converged" in t else None},
            0,
            {"both halves kept working": all(c or m >= self.MIN_MADE for c, m in zip(self.halves_complete, self.made)),
             "identical coverage after healing": "converged" in t})


# -- late-joiner -------------------------------------------------------------------------------
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


TYPES: dict[str, type[Scenario]] = {s.name: s for s in (TamperedStep, LyingAuditor, CopyingAuditor, ForgedAndMalformed,
                                                        Sybil, Crash, Partition, LateJoiner)}
assert tuple(TYPES) == SCENARIOS


# -- the devnet with scenarios -----------------------------------------------------------------
def _layout(opts: DevnetOptions, chosen: list[Scenario]) -> list[Node]:
    auditors = max([opts.nodes] + [s.min_auditors for s in chosen])
    extra = ()
    for s in chosen:
        extra += s.auditor_args()
    nodes = [Node("auditor", audit=True, args=extra, half=i % 2) for i in range(auditors)]
    nodes.append(Node("observer", audit=False))
    for s in chosen:
        nodes += s.nodes()
    return [n for n in nodes if not n.late] + [n for n in nodes if n.late]  # late nodes start last


def run_scenarios(opts: DevnetOptions) -> dict:
    from open1b.deterministic.trainer import publish_run

    from .forged_run import publish_forged_run

    started = time.monotonic()
    chosen = [TYPES[name](opts) for name in opts.scenarios]
    redundancy = max([opts.redundancy] + [s.min_redundancy for s in chosen])
    forgeries: dict[int, str] = {}
    for s in chosen:
        forgeries.update(s.forgeries())
    if any(s.needs_forgery for s in chosen) and not forgeries:
        forgeries = {opts.steps // 2: "bitflip"}
    workdir = opts.workdir or Path(tempfile.mkdtemp(prefix="open1b-scenario-"))
    workdir.mkdir(parents=True, exist_ok=True)
    run_dir = workdir / "run"
    publisher = Identity(os.urandom(32))
    try:
        if forgeries:
            manifest = publish_forged_run(run_dir, publisher, steps=opts.steps, seed=opts.seed, forgeries=forgeries)
        else:
            manifest = publish_run(run_dir, publisher, steps=opts.steps, seed=opts.seed)
        nodes = _layout(opts, chosen)
        with contextlib.ExitStack() as stack:
            halves = None
            partition = next((s for s in chosen if isinstance(s, Partition)), None)
            if partition is not None:
                from .netns import Partition as Netns

                partition.partition = Netns()
                halves = stack.enter_context(partition.partition)
            daemons = Daemons(workdir, run_dir, redundancy)
            for node in nodes:
                if halves is None:
                    daemons.plan(1)
                else:
                    half = halves[node.half]
                    daemons.plan(1, host=half.address, api_host=half.api_address, prefix=half.prefix)
            try:
                net = Net(opts, manifest, daemons, nodes, started)
                summary = _drive(net, chosen, redundancy, forgeries)
            finally:
                daemons.stop()
        summary["workdir"] = str(workdir) if opts.keep or opts.workdir else None
        return summary
    finally:
        if not opts.keep and opts.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


def _drive(net: Net, chosen: list[Scenario], redundancy: int, forgeries: dict[int, str]) -> dict:
    opts, daemons = net.opts, net.daemons
    for i, node in enumerate(net.nodes):
        if not node.late:
            daemons.start(i, audit=node.audit, bootstrap=[daemons.addrs[1 if i == 0 else 0]], extra_args=node.args)
    for i, node in enumerate(net.nodes):
        if not node.late:
            net.api(i)
    # The trainer's run directory reaches the network only by being published (as `open1b-node
    # publish` does): the observer checks and serves it; auditors fetch what they replay from peers.
    for i in dict.fromkeys([net.observer] + [j for s in chosen for j in s.publishers(net)]):
        daemons.publish(i)
    _say(f"{len(net.nodes)} daemons ({', '.join(sorted({n.role for n in net.nodes}))}); scenarios: "
         f"{', '.join(opts.scenarios)}; run {net.run[:16]}…")
    deadline = net.started + opts.deadline_s
    covered = False
    while time.monotonic() < deadline:
        try:
            for s in chosen:
                s.tick(net)
            covered = net.coverage(net.observer)["complete"] and all(s.done(net) for s in chosen)
        except ApiUnavailable as exc:  # a daemon being killed or restarted: try again next poll
            _say(f"(api: {exc})")
        if covered:
            break
        time.sleep(POLL_S)
    if covered:
        for s in chosen:
            s.after(net)
    converged, cov = _converge(net)
    reports = {}
    for s in chosen:
        try:
            reports[s.name] = s.report(net)
        except (ApiUnavailable, DevnetError, KeyError, IndexError) as exc:
            reports[s.name] = _result({}, {}, 0, {f"report failed: {exc}": False})
    lost = _lost(net)
    statuses = {i: net.get(i, "/v1/status") for i in range(len(net.nodes)) if net.running(i)}
    return {
        "run": net.run, "steps": opts.steps, "redundancy": redundancy, "nodes": len(net.nodes),
        "scenarios": reports, "forged_steps": {str(k): v for k, v in sorted(forgeries.items())},
        "complete": bool(cov and cov["complete"]), "converged": converged, "lost": lost,
        "ok": covered and converged and lost == 0 and all(r["ok"] for r in reports.values()),
        "verified_steps": cov["verified_steps"] if cov else 0, "disputed_steps": cov["disputed_steps"] if cov else [],
        "refuted_steps": cov["refuted_steps"] if cov else [], "flagged": cov["flagged"] if cov else [],
        "wall_seconds": net.elapsed(),
        "per_node": [{"index": i, "role": n.role, "peer_id": net.peer(i), "running": net.running(i),
                      "replays": statuses[i]["replays"] if i in statuses else None,
                      "banned": statuses[i]["banned"] if i in statuses else None,
                      "validation": statuses[i]["validation"] if i in statuses else None}
                     for i, n in enumerate(net.nodes)],
        "per_step": cov["per_step"] if cov else [],
    }


def _converge(net: Net) -> tuple[bool, dict | None]:
    """Wait (bounded) until every honest node reports the observer's coverage."""
    deadline = time.monotonic() + CONVERGE_TIMEOUT_S
    cov = None
    while True:
        try:
            cov = net.coverage(net.observer)
            want = canonical(cov)
            if all(canonical(net.coverage(i)) == want for i in net.honest()):
                return True, cov
        except ApiUnavailable:
            pass
        if time.monotonic() > deadline:
            return False, cov
        time.sleep(POLL_S)


def _lost(net: Net) -> int:
    """Attestations some honest node made and holds that another running honest node lacks, and
    still lacks after :data:`LOST_GRACE_S`. Nodes are read one after another, so one that signs
    an attestation while the others are being read (a replay started during a partition that
    finishes after coverage converged) is missing from the earlier reads without being lost;
    gossip and sync deliver it within seconds, a lost one never arrives."""
    deadline = time.monotonic() + LOST_GRACE_S
    while True:
        held = {i: {a["digest"]: a["signer"] for a in net.attestations(i)} for i in net.honest()}
        made = {d for i, digests in held.items() for d, signer in digests.items() if signer == net.peer(i)}
        missing = sum(1 for d in made if any(d not in digests for digests in held.values()))
        if not missing or time.monotonic() > deadline:
            return missing
        time.sleep(POLL_S)


def render(summary: dict) -> str:
    lines = [f"run        {summary['run']}  ({summary['steps']} steps, redundancy {summary['redundancy']},"
             f" {summary['nodes']} daemons, {summary['wall_seconds']} s)",
             f"coverage   {summary['verified_steps']} verified, disputed {summary['disputed_steps'] or 'none'},"
             f" refuted {summary['refuted_steps'] or 'none'}; {'complete' if summary['complete'] else 'INCOMPLETE'},"
             f" {'converged' if summary['converged'] else 'NOT converged'}, {summary['lost']} lost",
             ""]
    for name, r in summary["scenarios"].items():
        lines.append(f"{name}: {'ok' if r['ok'] else 'FAILED'}")
        lines.append(f"  injected  {r['injected'].get('count')} {r['injected'].get('what', '')}")
        lines.append(f"  detected  {r['detected'].get('count')} {r['detected'].get('what', '')}")
        lines.append(f"  lost      {r['lost']}")
        for check, passed in r["checks"].items():
            lines.append(f"  [{'x' if passed else ' '}] {check}")
    return "\n".join(lines)
