"""What every scenario shares: the node layout (:class:`Node`), the running devnet as scenarios
see it (:class:`Net`), the :class:`Scenario` hooks the driver calls, and the report record."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from open1b.node.client import call
from open1b.protocol import Identity, RunManifest

from ..daemons import Daemons
from ..options import DevnetOptions

POLL_S = 0.5
# Bounds on waits that end at an event (coverage agreeing, a statement arriving): generous, since
# they cost nothing when the event comes, and a second devnet on the same cores delays sync rounds
# (every 2 s) and daemon starts many times over (docs/reliability.md, "under load").
CONVERGE_TIMEOUT_S = 120.0
LOST_GRACE_S = 60.0  # many sync rounds: enough for anything that was merely in flight
HONEST_ROLES = ("auditor", "observer", "observer-b", "late", "home-publisher")  # one trust policy: their coverage must agree


@dataclass
class Node:
    role: str
    audit: bool
    args: tuple[str, ...] = ()
    late: bool = False  # started once the run is covered
    half: int = 0  # partition half
    site: str = ""  # the nat scenario's home ("a", "b") or "internet"


class Net:
    """The running devnet as scenarios see it: nodes by index, their APIs, and a clock."""

    def __init__(self, opts: DevnetOptions, manifest, daemons: Daemons, nodes: list[Node], started: float) -> None:
        self.opts, self.manifest, self.daemons, self.nodes, self.started = opts, manifest, daemons, nodes, started
        self.run = manifest.run_id.hex()
        self.observer = next(i for i, n in enumerate(nodes) if n.role == "observer")
        self._apis: dict[int, str] = {}
        self.publishing_at = 0.0  # net.elapsed() when the driver started publishing the run
        # ... and when every publisher's publish call returned (every blob provided); None until
        # then, while scenarios are already polled (the spot scenarios time flags from publishing)
        self.published_at: float | None = None
        # One clock per poll, so that what scenarios see in one poll is timed alike; and the first
        # poll at which the observer's coverage was complete (it may go back: a late contradiction
        # discounts a trusted liar's attestations, and the driver then keeps going).
        self.poll_at = 0.0
        self.covered_at: float | None = None

    def api(self, i: int) -> str:
        if i not in self._apis:
            self._apis[i] = self.daemons.api(i)
        return self._apis[i]

    def forget_api(self, i: int) -> None:
        self._apis.pop(i, None)

    def get(self, i: int, path: str) -> Any:
        return call(self.api(i), path, token=self.daemons.token(i))

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


def canonical(cov: dict) -> dict:
    """What two nodes holding the same statements must agree on (live claims are only hints)."""
    return {"per_step": [{k: v for k, v in s.items() if k != "claimants"} for s in cov["per_step"]],
            "flagged": cov["flagged"], "complete": cov["complete"]}


class Scenario:
    name = ""
    min_redundancy = 1
    min_auditors = 1
    min_steps = 1  # a run shorter than this is covered before the scenario can do what it tests
    needs_forgery = False
    waiting = "done"  # the event :meth:`done` waits for, named when a run ends without it

    def __init__(self, opts: DevnetOptions) -> None:
        self.opts = opts

    def nodes(self) -> list[Node]:
        return []

    def auditor_args(self) -> tuple[str, ...]:
        return ()

    def observer_args(self) -> tuple[str, ...]:
        """Flags of the observer, the node that publishes the run (and answers its challenges)."""
        return ()

    def publishers(self, net: Net) -> list[int]:
        """Nodes besides the observer that publish the run (each serves its files)."""
        return []

    def forgeries(self) -> dict[int, str]:
        return {}

    def prepare_run(self, run_dir: Path, manifest: RunManifest, publisher: Identity,
                    auditors: list[Identity]) -> RunManifest:
        """The published run, once every node's key exists and before any node starts: a scenario
        may re-sign the manifest (the same run, another ``created_at``); returns the one to publish."""
        return manifest

    def tick(self, net: Net) -> None:
        """Called every poll until the run is covered and every scenario is done."""

    def done(self, net: Net) -> bool:
        return True

    def still_waiting(self, net: Net) -> str:
        """What a run that reached its deadline still lacked, :attr:`waiting` by default: a scenario
        that knows which step, node or condition is missing names it."""
        return self.waiting

    def after(self, net: Net) -> None:
        """Called once the run is covered."""

    def report(self, net: Net) -> dict:
        raise NotImplementedError


def _result(injected: dict, detected: dict, lost: int, checks: dict[str, bool], **facts: Any) -> dict:
    return {"injected": injected, "detected": detected, "lost": lost, "checks": checks,
            "ok": all(checks.values()) and lost == 0, **facts}
