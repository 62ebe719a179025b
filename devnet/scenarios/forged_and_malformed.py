"""``forged-and-malformed``: a spammer publishes every kind of forged or malformed statement; each
must be refused as specified, its sender penalised, nothing stored."""

from __future__ import annotations

import json

from ..adversaries import INJECTED_FILE, SPAM_BURSTS
from .base import Node, Scenario, _result


class ForgedAndMalformed(Scenario):
    name = "forged-and-malformed"
    waiting = "the spammer banned by every honest node, or done with all its bursts"

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
