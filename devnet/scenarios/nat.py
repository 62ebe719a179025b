"""``nat``: nodes at home behind NAT routers (:mod:`..nat_topology`): the run is published from
home A (port-preserving NAT) and audited from home B (``--random-fully``) and the internet,
where the bootstrap node and the observer sit (public: they relay for the homes). Home routers
drop unsolicited inbound connections, so a home node is reached only over connections it dialled
itself, through a relay, or after a hole punch (issue 27).

Its ``detected`` gives, over the node pairs that talked (a connection seen at some poll), how each
pair ended: ``connections`` (``direct``, ``relayed`` or ``none``), the same for home A ↔ home B
pairs (``homes_a_b``, with the share that ended direct: behind ``--random-fully`` a punch cannot
predict B's port, so none should), ``hole_punches`` (started and succeeded, over all nodes),
``checkpoints_via_relay`` (checkpoints fetched over a relayed stream: must be 0),
``internet_fetches_dialled_back_by_a`` (checkpoint fetches by internet nodes whose bulk session
with a home A node that node opened, asked over libp2p: nobody can dial home A; must be some); the
report's ``checkpoint_sources`` says, per checkpoint fetched, which site fetched it from which."""

from __future__ import annotations

from ..nat_topology import HomeSpec, NatTopology, Site
from .base import Node, Scenario, _result

KINDS = ("direct", "relayed", "none")
POLL_CONNECTIONS_S = 5.0  # how often the scenario reads every node's connections

SITES = ("internet", "a", "b")
"""Where auditor ``i`` runs: ``SITES[i % 3]``; auditor 0, every node's bootstrap, is on the internet."""


class Nat(Scenario):
    name = "nat"
    min_auditors = 3
    min_redundancy = 3  # every auditor replays every step: each site must fetch and attest, or coverage stalls
    waiting = "every home node holding a relay reservation, and homes A and B having talked (through a relay)"

    def __init__(self, opts):
        super().__init__(opts)
        self.topology = NatTopology([HomeSpec("a"), HomeSpec("b", nat="random")])
        self.talked: set[frozenset[str]] = set()  # peer pairs seen connected at some poll
        self._polled_at = -POLL_CONNECTIONS_S
        self.homes_reserved = self.homes_met = False
        self.unreserved: list[str] | None = None  # the home nodes without a reservation at the last poll

    def tick(self, net) -> None:
        if net.poll_at - self._polled_at < POLL_CONNECTIONS_S:
            return
        self._polled_at = net.poll_at
        site_of = {net.peer(i): self.site(n).name for i, n in enumerate(net.nodes)}
        statuses = self._statuses(net)
        for status in statuses.values():
            self.talked |= {frozenset((status["peer_id"], peer)) for peer in status["network"]["peers"]}
        self.unreserved = [f"{net.nodes[i].role} {i} (home {site_of[s['peer_id']]})" for i, s in statuses.items()
                           if site_of[s["peer_id"]] != "internet" and not s["network"]["reserved_on"]]
        self.homes_reserved = not self.unreserved
        self.homes_met = any({site_of.get(p) for p in pair} == {"a", "b"} for pair in self.talked)

    def done(self, net) -> bool:
        """Once every home node holds a relay reservation and homes A and B have talked (through a
        relay: nothing else joins them): a tiny run is covered before that, over the internet nodes."""
        return self.homes_reserved and self.homes_met

    def still_waiting(self, net) -> str:
        if self.unreserved is None:
            return f"{self.waiting}: no node's connections read yet"
        missing = [f"a relay reservation on {', '.join(self.unreserved)}"] if self.unreserved else []
        if not self.homes_met:
            missing.append(f"homes A and B to talk (no connection between them in {len(self.talked)} pairs seen)")
        return "; ".join(missing)

    @staticmethod
    def _statuses(net) -> dict[int, dict]:
        return {i: net.get(i, "/v1/status") for i in range(len(net.nodes)) if net.running(i)}

    @staticmethod
    def _pair_kinds(statuses: dict[int, dict], pairs: set[frozenset[str]]) -> dict[frozenset[str], str]:
        """How each pair ended: direct if either end has a direct connection, relayed if either has
        only a relayed one, else none."""
        seen: dict[frozenset[str], set[str]] = {pair: set() for pair in pairs}
        for status in statuses.values():
            for peer, kind in status["network"]["peers"].items():
                seen.setdefault(frozenset((status["peer_id"], peer)), set()).add(kind)
        return {pair: next((k for k in KINDS[:2] if k in kinds), "none") for pair, kinds in seen.items()}

    def nodes(self):
        return [Node("home-publisher", audit=False, site="a")]

    def place(self, nodes: list[Node]) -> None:
        """Put the generic layout's auditors in the homes and the internet (the observer stays on
        the internet)."""
        auditors = [n for n in nodes if n.role == "auditor"]
        for i, node in enumerate(auditors):
            node.site = SITES[i % len(SITES)]

    def site(self, node: Node) -> Site:
        return self.topology.homes[node.site] if node.site in self.topology.homes else self.topology.internet

    def publishers(self, net):
        return net.indices("home-publisher")

    def report(self, net):
        site_of = {net.peer(i): self.site(n).name for i, n in enumerate(net.nodes)}
        members = {site: {p for p, s in site_of.items() if s == site} for site in SITES}
        attestations = net.attestations(net.observer)
        made = {site: sum(1 for a in attestations if a["signer"] in peers) for site, peers in members.items()}
        status = self._statuses(net)
        peers = {site: sorted(len(status[i]["peers"]) for i, n in enumerate(net.nodes)
                              if i in status and self.site(n).name == site) for site in SITES}
        ours = set(site_of)
        ended = {pair: kind for pair, kind in self._pair_kinds(status, self.talked).items() if pair <= ours}
        a_b = {pair: kind for pair, kind in ended.items() if {site_of[p] for p in pair} == {"a", "b"}}
        punches = [s["network"]["hole_punches"] for s in status.values()]
        sources = [{"fetched_by": site_of[s["peer_id"]], "blob": src["blob"], "path": src["path"],
                    "from": [site_of.get(p, "?") for p in src["from"]], "relayed": src["relayed"],
                    "dialled_back": [site_of.get(p, "?") for p in src.get("dialled_back", ())]}
                   for s in status.values() for src in s["blobs"]["sources"] if src["blob"].startswith("checkpoint")]
        via_relay = sum(1 for src in sources if src["relayed"])
        # the internet cannot dial home A: each of its bulk sessions with A was A dialling it back
        a_dialled_back = sum(1 for src in sources if src["fetched_by"] == "internet" and "a" in src["dialled_back"])
        complete = net.coverage(net.observer)["complete"]
        reserved = {site: sorted(len(s["network"]["reserved_on"]) for s in status.values() if site_of[s["peer_id"]] == site)
                    for site in SITES}
        return _result(
            {"what": "homes A (port-preserving NAT) and B (--random-fully) behind routers that drop inbound",
             "count": 2, "nodes_per_site": {site: len(m) for site, m in members.items()}},
            {"what": "attestations at the observer, by the signer's site", "count": sum(made.values()),
             "attestations_by_site": made, "connected_peers_by_site": peers,
             "connections": {k: sum(1 for v in ended.values() if v == k) for k in KINDS},
             "homes_a_b": {**{k: sum(1 for v in a_b.values() if v == k) for k in KINDS},
                           "direct_share": round(sum(v == "direct" for v in a_b.values()) / len(a_b), 3) if a_b else None},
             "hole_punches": {"attempts": sum(p["attempts"] for p in punches),
                              "succeeded": sum(p["succeeded"] for p in punches)},
             "checkpoints_via_relay": via_relay, "internet_fetches_dialled_back_by_a": a_dialled_back,
             "relay_reservations_by_site": reserved},
            0,
            {"coverage complete at the observer": complete,
             "home B audited (its auditor attested)": made["b"] > 0,
             "the internet audited": made["internet"] > 0,
             "no checkpoint went through a relay": via_relay == 0,
             "the internet fetched from home A over a bulk dial-back": a_dialled_back > 0,
             "every home node holds a relay reservation": all(n for site in ("a", "b") for n in reserved[site]),
             "homes A and B talked (through a relay)": bool(a_b)},
            checkpoint_sources=sources)
