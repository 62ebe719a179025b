"""``nat``: nodes at home behind NAT routers (:mod:`..nat_topology`): the run is published from
home A (port-preserving NAT) and audited from home B (``--random-fully``) and the internet,
where the bootstrap node and the observer sit. Home routers drop unsolicited inbound connections,
so a home node is reached only over connections it dialled itself (issue 27).

This is the wiring only: without relays, reachability and a bulk path that works towards a node
that cannot be dialled (issue 27 items 1–3), home B cannot reach home A at all and no one can
dial a home node's bulk port, so the run's checkpoints leave home A only if an internet node
fetches them over a connection home A opened. The report says what each site managed; its
checks state the issue's targets, and fail until those items land. The issue's ``connections``,
``hole_punches`` and ``checkpoints_via_relay`` are not reported: no node tells yet how it is
connected to a peer."""

from __future__ import annotations

from ..nat_topology import HomeSpec, NatTopology, Site
from .base import Node, Scenario, _result

SITES = ("internet", "a", "b")
"""Where auditor ``i`` runs: ``SITES[i % 3]``; auditor 0, every node's bootstrap, is on the internet."""


class Nat(Scenario):
    name = "nat"
    min_auditors = 3
    min_redundancy = 3  # every auditor replays every step: each site must fetch and attest, or coverage stalls

    def __init__(self, opts):
        super().__init__(opts)
        self.topology = NatTopology([HomeSpec("a"), HomeSpec("b", nat="random")])

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
        members = {site: {net.peer(i) for i, n in enumerate(net.nodes) if self.site(n).name == site}
                   for site in SITES}
        attestations = net.attestations(net.observer)
        made = {site: sum(1 for a in attestations if a["signer"] in peers) for site, peers in members.items()}
        status = {i: net.get(i, "/v1/status") for i in range(len(net.nodes)) if net.running(i)}
        peers = {site: sorted(len(status[i]["peers"]) for i, n in enumerate(net.nodes)
                              if i in status and self.site(n).name == site) for site in SITES}
        complete = net.coverage(net.observer)["complete"]
        return _result(
            {"what": "homes A (port-preserving NAT) and B (--random-fully) behind routers that drop inbound",
             "count": 2, "nodes_per_site": {site: len(m) for site, m in members.items()}},
            {"what": "attestations at the observer, by the signer's site", "count": sum(made.values()),
             "attestations_by_site": made, "connected_peers_by_site": peers},
            0,
            {"coverage complete at the observer": complete,
             "home B audited (its auditor attested)": made["b"] > 0,
             "the internet audited": made["internet"] > 0})
