"""``open1b-node devnet --scenario NAME``: inject a fault or an adversary into a devnet of real
daemon processes and check that the network keeps its promises (docs/reliability.md).

One module per scenario; each subclasses :class:`~.base.Scenario`. A scenario adds nodes (honest or
deliberately broken, :mod:`..adversaries`), forges the published run (:mod:`..forged_run`), acts
while the run is being covered (kills, partitions) and after it (restarts, late joiners), and
reports what it injected, what the network detected and what was lost. Scenarios combine: each
adds its own nodes and actions to one devnet.

Every run also checks, whatever the scenarios: the observer's coverage completed; every honest
node ends with the same coverage (``converged``); and no honest attestation is missing from any
honest node (``lost``). Reports hold the signed evidence itself (hex-encoded statements), so a
test re-checks it without trusting the devnet's own judgement.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import tempfile
import time
from pathlib import Path

from open1b.deterministic.device import select_device_or_cpu
from open1b.deterministic.trainer import publish_run
from open1b.node.client import ApiUnavailable
from open1b.node.identity_file import load_identity
from open1b.node.jobs import JobState

from ..daemons import Daemons, say
from ..forged_run import publish_forged_run
from ..netns import Partition as Netns
from ..options import SCENARIOS, DevnetError, DevnetOptions
from .base import CONVERGE_TIMEOUT_S, LOST_GRACE_S, POLL_S, Net, Node, Scenario, _result, canonical
from .copying_auditor import CopyingAuditor
from .crash import Crash
from .device_classes import DeviceClasses
from .forged_and_malformed import ForgedAndMalformed
from .forged_data import ForgedData
from .forged_microbatch import ForgedMicrobatch
from .fraud_proofs import FalseAccusation, ForgedOp, OversizedDisputant, SilentDisputant
from .late_joiner import LateJoiner
from .lying_auditor import LyingAuditor
from .nat import Nat
from .partition import Partition
from .refusing_trainer import RefusingTrainer
from .skipped_update import SkippedUpdate
from .straggler import Straggler
from .sybil import Sybil
from .tampered_step import TamperedStep

TYPES: dict[str, type[Scenario]] = {s.name: s for s in (TamperedStep, LyingAuditor, CopyingAuditor, ForgedAndMalformed,
                                                        Sybil, Crash, Partition, LateJoiner, ForgedData, SkippedUpdate,
                                                        ForgedMicrobatch, RefusingTrainer, Nat, ForgedOp,
                                                        FalseAccusation, Straggler, DeviceClasses, SilentDisputant,
                                                        OversizedDisputant)}
assert tuple(TYPES) == SCENARIOS


# -- the devnet with scenarios -----------------------------------------------------------------
def _layout(opts: DevnetOptions, chosen: list[Scenario]) -> list[Node]:
    auditors = max([opts.nodes] + [s.min_auditors for s in chosen])
    extra = ()
    for s in chosen:
        extra += s.auditor_args()
    nodes = [Node("auditor", audit=True, args=extra, half=i % 2) for i in range(auditors)]
    observer: tuple[str, ...] = ()
    for s in chosen:
        observer += s.observer_args()
    nodes.append(Node("observer", audit=False, args=observer))
    for s in chosen:
        nodes += s.nodes()
    return [n for n in nodes if not n.late] + [n for n in nodes if n.late]  # late nodes start last


def run_scenarios(opts: DevnetOptions) -> dict:
    started = time.monotonic()
    steps = max([opts.steps] + [TYPES[name].min_steps for name in opts.scenarios])
    opts = dataclasses.replace(opts, steps=steps)  # validated again
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
    try:
        nodes = _layout(opts, chosen)
        with contextlib.ExitStack() as stack:
            halves = None
            partition = next((s for s in chosen if isinstance(s, Partition)), None)
            if partition is not None:
                partition.partition = Netns()
                halves = stack.enter_context(partition.partition)
            nat = next((s for s in chosen if isinstance(s, Nat)), None)
            if nat is not None:
                if partition is not None:
                    raise DevnetError("the nat and partition scenarios each build their own network: run them apart")
                stack.enter_context(nat.topology)
                nat.place(nodes)
            daemons = Daemons(workdir, run_dir, redundancy, device=opts.device)
            for node in nodes:
                if nat is not None:
                    site = nat.site(node)
                    daemons.plan(1, host=site.address, api_host=site.api_address, prefix=site.prefix)
                elif halves is None:
                    daemons.plan(1)
                else:
                    half = halves[node.half]
                    daemons.plan(1, host=half.address, api_host=half.api_address, prefix=half.prefix)
            auditors = [load_identity(daemons.dirs[i]) for i, n in enumerate(nodes) if n.role == "auditor"]
            # The trainer publishes through its own node, the observer: an answer to a spot-check
            # challenge binds the trainer only when the run's publisher sends it (docs/protocol.md §5.5).
            publisher = load_identity(daemons.dirs[next(i for i, n in enumerate(nodes) if n.role == "observer")])
            if forgeries:
                manifest = publish_forged_run(run_dir, publisher, steps=opts.steps, seed=opts.seed, forgeries=forgeries)
            else:
                manifest = publish_run(run_dir, publisher, steps=opts.steps, seed=opts.seed,
                                       device=select_device_or_cpu(opts.device))
            for s in chosen:
                manifest = s.prepare_run(run_dir, manifest, publisher, auditors)
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
    net.publishing_at = net.elapsed()

    def poll_while_providing(job: dict) -> None:
        # The publisher holds the run once its files are checked, and auditors learn it by sync
        # while its blobs are provided (a few minutes for 256 steps): the scenarios watch from then.
        if job["state"] in (JobState.PROVIDING, JobState.ANNOUNCING):
            _poll(net, chosen)

    for i in dict.fromkeys([net.observer] + [j for s in chosen for j in s.publishers(net)]):
        daemons.publish(i, poll_while_providing)
    net.published_at = net.elapsed()
    say(f"{len(net.nodes)} daemons ({', '.join(sorted({n.role for n in net.nodes}))}); scenarios: "
         f"{', '.join(opts.scenarios)}; run {net.run[:16]}…")
    deadline = net.started + opts.deadline_s
    covered, converged, cov = False, False, None
    while time.monotonic() < deadline:
        if _poll(net, chosen):
            # Coverage is not monotonic: a contradiction that arrives late flags a trusted liar and
            # its steps need other replays. The run is covered when the coverage the honest nodes
            # converge on is complete.
            converged, cov = _converge(net)
            covered = bool(cov and cov["complete"])
            if covered:
                break
        time.sleep(POLL_S)
    waiting_for = [] if covered else _waiting_for(net, chosen)
    if covered:
        for s in chosen:
            s.after(net)
    else:
        say(f"deadline ({opts.deadline_s:.0f} s) passed, still waiting for: {'; '.join(waiting_for)}")
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
        "wall_seconds": net.elapsed(), "waiting_for": waiting_for,
        "per_node": [{"index": i, "role": n.role, "peer_id": net.peer(i), "running": net.running(i),
                      "replays": statuses[i]["replays"] if i in statuses else None,
                      "banned": statuses[i]["banned"] if i in statuses else None,
                      "validation": statuses[i]["validation"] if i in statuses else None}
                     for i, n in enumerate(net.nodes)],
        "per_step": cov["per_step"] if cov else [],
    }


def _poll(net: Net, chosen: list[Scenario]) -> bool:
    """One poll: every scenario's tick, on one clock; whether the observer's coverage is complete
    and every scenario is done."""
    try:
        net.poll_at = net.elapsed()
        complete = net.coverage(net.observer)["complete"]
        if complete and net.covered_at is None:
            net.covered_at = net.poll_at
        for s in chosen:
            s.tick(net)
        return complete and all(s.done(net) for s in chosen)
    except ApiUnavailable as exc:  # a daemon being killed or restarted: try again next poll
        say(f"(api: {exc})")
        return False


def _waiting_for(net: Net, chosen: list[Scenario]) -> list[str]:
    """What a run that reached its deadline was still waiting for: the observer's coverage, and
    each scenario's event."""
    waiting = []
    try:
        cov = net.coverage(net.observer)
        if not cov["complete"]:
            waiting.append(f"the observer's coverage to complete ({cov['verified_steps']} of {net.manifest.steps} "
                           f"steps verified, disputed {cov['disputed_steps']}, refuted {cov['refuted_steps']})")
        for s in chosen:
            if not s.done(net):
                waiting.append(f"{s.name}: {s.still_waiting(net)}")
    except ApiUnavailable as exc:
        waiting.append(f"the observer's API ({exc})")
    return waiting


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
        if r.get("missing"):  # what a failed check lacked, where the scenario can name it
            lines.append(f"  missing   {'; '.join(r['missing'])}")
        for check, passed in r["checks"].items():
            lines.append(f"  [{'x' if passed else ' '}] {check}")
    return "\n".join(lines)
