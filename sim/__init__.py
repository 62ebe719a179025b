"""open1b at internet scale: thousands of virtual auditors running the node's real claiming code.

What is real and what is simulated (docs/scale.md has the long version):

* real — the daemon's step planning (:func:`open1b.node.planner.pick`, :class:`~open1b.node.planner.StepOrder`),
  its incremental index (:class:`open1b.node.deficits.DeficitIndex`), the claim protocol
  (:class:`open1b.node.claim_records.ClaimAgent`: read slots, ``free_slot``, write, announce, re-check,
  renew), the protocol's claim keys, lease liveness and strict claim order (``select_claim``),
  and signed, canonically encoded ``Claim`` and ``Attestation`` messages;
* simulated — time (:mod:`.loop`), the DHT and gossip (:mod:`.network`: latency, loss, sync),
  replays (a duration drawn per hardware class, :mod:`.hardware`), who is online (:class:`.scenario.Churn`),
  and, optionally, the Ed25519 arithmetic (:mod:`.crypto`).

Entry point: :func:`simulate` (a :class:`Scenario` in, a JSON-able summary out).
"""

from typing import Callable

from .network import NetworkModel
from .params import STRATEGIES, Churn, Scenario


def simulate(sc: Scenario, progress: Callable[[float, int], None] | None = None) -> dict:
    """``progress``: told (virtual seconds, steps covered) about once a wall minute, for runs
    that take long (open1b only); it reads, and changes no decision."""
    if sc.strategy == "open1b":
        from .swarm import Swarm

        return Swarm(sc).simulate(progress)
    from .baselines import run_baseline

    return run_baseline(sc)


__all__ = ["Churn", "NetworkModel", "Scenario", "STRATEGIES", "simulate"]
