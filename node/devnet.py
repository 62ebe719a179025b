"""``open1b-node devnet``: a whole audit on one machine, with real daemon processes.

1. train a fresh run into a directory (optionally forging the state after one step);
2. start N auditor daemons and one observer daemon (audits nothing) as separate OS processes on
   127.0.0.1, all bootstrapping from the first; no daemon is given the run directory;
3. publish the run through the observer's API, exactly as ``open1b-node publish`` does: the
   observer checks and serves the files and gossips the manifest, and every auditor fetches the
   checkpoints and samples it replays from peers (docs/run-format.md §6);
4. poll the observer's API until every step has ``redundancy`` distinct attesters, or a deadline;
5. read coverage from the observer — a node that replayed nothing, so everything it reports
   reached it over the network — shut every daemon down through its API, and summarise.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from open1b.deterministic.trainer import publish_run
from open1b.protocol import Identity, Open1bError

from .adversary import ENV_SWITCH as DEVNET_ENV
from .client import ApiUnavailable, call, publish
from .daemon import API_ADDR_FILE
from .datadir import init_data_dir
from .progress import progress

EVAL_DOCUMENTS = 8
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
# Faults and adversaries a devnet can inject (node/scenarios.py; docs/reliability.md).
SCENARIOS = ("tampered-step", "lying-auditor", "copying-auditor", "forged-and-malformed", "sybil", "crash",
             "partition", "late-joiner")


class DevnetError(Open1bError):
    """The devnet could not be brought up or torn down."""


@dataclass(frozen=True)
class DevnetOptions:
    nodes: int = 3
    steps: int = 8
    redundancy: int = 1
    tamper_step: int | None = None
    eval_every: int = 0  # > 0: hold out EVAL_DOCUMENTS documents and evaluate every eval_every-th state
    tamper_eval: int | None = None  # the trainer's result for this state is false (one bit flipped)
    deadline_s: float = 150.0
    seed: int = 0
    workdir: Path | None = None
    keep: bool = False
    scenarios: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = set(self.scenarios) - set(SCENARIOS)
        if unknown:
            raise ValueError(f"unknown scenario(s) {sorted(unknown)}; known: {', '.join(SCENARIOS)}")
        if self.nodes < 1 or self.steps < 1 or self.redundancy < 1:
            raise ValueError("nodes, steps and redundancy must be at least 1")
        if self.redundancy > self.nodes:
            raise ValueError(f"redundancy {self.redundancy} needs at least that many nodes (got {self.nodes})")
        if self.tamper_step is not None and not 0 <= self.tamper_step < self.steps:
            raise ValueError(f"--tamper-step must be in [0, {self.steps})")


class Daemons:
    """The daemon processes of a devnet; stops them all on exit, whatever happened.

    :meth:`plan` initialises every data directory (so each node's peer ID is known) and reserves
    a listen port per node before anything starts; then all daemons can start at once, each
    bootstrapping from another, and none audits alone while the others are still starting.
    """

    def __init__(self, workdir: Path, run_dir: Path, redundancy: int, *, run_on_all: bool = False) -> None:
        """``run_dir`` reaches the network through :meth:`publish`; ``run_on_all`` instead hands
        it to every daemon (``--run``, an operator's local copy), as devnets did before runs
        were published."""
        self.workdir, self.run_dir, self.redundancy, self.run_on_all = workdir, run_dir, redundancy, run_on_all
        self.procs: list[subprocess.Popen] = []
        self.dirs: list[Path] = []
        self.addrs: list[str] = []
        self.api_hosts: list[str] = []
        self.prefixes: list[tuple[str, ...]] = []  # what a node's command runs under (a network namespace)

    def plan(self, count: int, *, host: str = "127.0.0.1", api_host: str = "127.0.0.1",
             prefix: tuple[str, ...] = ()) -> list[str]:
        """Prepare ``count`` more nodes listening on ``host``; returns their multiaddrs."""
        for index in range(len(self.dirs), len(self.dirs) + count):
            data_dir = self.workdir / f"node-{index}"
            peer_id = init_data_dir(data_dir).peer_id
            self.dirs.append(data_dir)
            self.addrs.append(f"/ip4/{host}/tcp/{_free_port()}/p2p/{peer_id}")
            self.api_hosts.append(api_host)
            self.prefixes.append(prefix)
        return self.addrs[-count:]

    def peer_id(self, index: int) -> str:
        return self.addrs[index].rsplit("/", 1)[1]

    def start(self, index: int, *, audit: bool, bootstrap: list[str], extra_args: tuple[str, ...] = (),
              env: dict[str, str] | None = None) -> None:
        """Start (or restart) node ``index``. It trusts every node planned so far: one operator
        runs the whole devnet (docs/protocol.md §8.1)."""
        data_dir = self.dirs[index]
        host, port = self.addrs[index].split("/")[2], self.addrs[index].split("/")[4]
        cmd = [*self.prefixes[index], sys.executable, "-m", "open1b.node.cli", "daemon", "--data-dir", str(data_dir),
               "--listen", f"{host}:{port}", "--api", f"{self.api_hosts[index]}:0",
               "--redundancy", str(self.redundancy), "--log-prefix", f"node-{index} "]
        if self.run_on_all:
            cmd += ["--run", str(self.run_dir)]
        for addr in bootstrap:
            cmd += ["--bootstrap", addr]
        for other in range(len(self.addrs)):
            if other != index:
                cmd += ["--trust", self.peer_id(other)]
        if not audit:
            cmd.append("--no-audit")
        cmd += extra_args
        (data_dir / API_ADDR_FILE).unlink(missing_ok=True)  # a killed daemon leaves its old one behind
        with open(data_dir / "daemon.log", "ab") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env={**os.environ, DEVNET_ENV: "1", **(env or {})})
        if index < len(self.procs):
            self.procs[index] = proc  # a restart
        else:
            self.procs.append(proc)

    def wait_file(self, index: int, name: str) -> str:
        path, proc = self.dirs[index] / name, self.procs[index]
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if path.exists():
                return path.read_text().strip()
            if proc.poll() is not None:
                raise DevnetError(f"daemon {index} exited with {proc.returncode}; see {self.dirs[index]}/daemon.log")
            time.sleep(0.05)
        raise DevnetError(f"daemon {index} did not write {name} within {START_TIMEOUT_S:.0f} s")

    def api(self, index: int) -> str:
        return self.wait_file(index, API_ADDR_FILE)

    def publish(self, index: int) -> dict:
        """Publish the run directory through node ``index``'s API (what ``open1b-node publish`` does)."""
        return publish(self.api(index), self.run_dir, timeout=START_TIMEOUT_S * 5)

    def kill(self, index: int) -> None:
        """``kill -9``: no shutdown path runs, as in a crash or power cut of the process."""
        self.procs[index].kill()
        self.procs[index].wait()

    def stop(self) -> None:
        for i, proc in enumerate(self.procs):
            if proc.poll() is None:
                try:
                    call(self.api(i), "/v1/shutdown", method="POST", timeout=2)
                except (ApiUnavailable, DevnetError):
                    proc.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _say(line: str) -> None:
    print(f"devnet: {line}", file=sys.stderr, flush=True)


def run_devnet(opts: DevnetOptions) -> dict:
    if opts.scenarios:
        from .scenarios import run_scenarios

        return run_scenarios(opts)
    started = time.monotonic()
    workdir = opts.workdir or Path(tempfile.mkdtemp(prefix="open1b-devnet-"))
    workdir.mkdir(parents=True, exist_ok=True)
    run_dir = workdir / "run"
    try:
        forged = f" (state after step {opts.tamper_step} forged)" if opts.tamper_step is not None else ""
        with progress(f"devnet: training and publishing a run{forged}", opts.steps) as update:
            trainer = Identity(os.urandom(32))
            manifest = publish_run(run_dir, trainer, steps=opts.steps, seed=opts.seed, tamper_step=opts.tamper_step,
                                   eval_documents=EVAL_DOCUMENTS if opts.eval_every else 0,
                                   eval_every=opts.eval_every or 1, progress=lambda done, total: update(done, ""))
        run_hex = manifest.run_id.hex()
        daemons = Daemons(workdir, run_dir, opts.redundancy)
        try:
            addrs = daemons.plan(opts.nodes + 1)
            observer = opts.nodes
            for i in range(opts.nodes + 1):
                daemons.start(i, audit=i != observer, bootstrap=[addrs[1 if i == 0 else 0]])
            apis = [daemons.api(i) for i in range(opts.nodes + 1)]
            job = daemons.publish(observer)
            _say(f"{opts.nodes} auditors and 1 observer up in {run_dir.parent}; run {run_hex[:16]}… published by the"
                 f" observer ({job['bytes']} bytes in {job['steps'] + 2} blobs, {job['seconds']} s); auditors fetch from peers")
            if opts.eval_every:  # the trainer signs its results with the run's key; the observer gossips them
                for result in trainer_results(run_dir, manifest, trainer, opts.tamper_eval):
                    call(apis[observer], f"/v1/eval?statement={result.encoded.hex()}", method="POST")
            cov = None
            deadline = started + opts.deadline_s
            with progress(f"devnet: steps with {opts.redundancy} attester(s), seen by the observer", opts.steps) as update:
                while time.monotonic() < deadline:
                    cov = call(apis[observer], f"/v1/coverage/{run_hex}?redundancy={opts.redundancy}")
                    done = sum(1 for s in cov["per_step"]
                               if len(set(s["auditors"]) | set(s["dissenters"])) >= opts.redundancy)
                    update(done, f"({cov['verified_steps']} verified, {len(cov['disputed_steps'])} disputed)")
                    if cov["complete"] and all(e["status"] != "unchecked" for e in cov["evaluations"]):
                        break
                    time.sleep(0.5)
            statuses = [call(api, "/v1/status") for api in apis]
            board = call(apis[observer], "/v1/leaderboard")
            implied = implied_board(apis[observer], manifest, opts.redundancy)
        finally:
            daemons.stop()
        wall = time.monotonic() - started
        replays = sum(s["replays"] for s in statuses)
        return {
            "run": run_hex, "steps": opts.steps, "redundancy": opts.redundancy, "nodes": opts.nodes,
            "complete": bool(cov and cov["complete"]),
            "verified_steps": cov["verified_steps"] if cov else 0,
            "disputed_steps": cov["disputed_steps"] if cov else [],
            "tamper_step": opts.tamper_step,
            "replays": replays, "replay_ratio": round(replays / (opts.steps * opts.redundancy), 4),
            "wall_seconds": round(wall, 2),
            "queried_from": {"peer_id": statuses[-1]["peer_id"], "replays": statuses[-1]["replays"]},
            "per_node": [{"peer_id": s["peer_id"], "replays": s["replays"], "claims_lost": s["claims_lost"],
                          "audit": s["audit"], "fetched_bytes": s["blobs"]["fetched_bytes"],
                          "served_bytes": s["blobs"]["served_bytes"]} for s in statuses],
            "per_step": [{"step": s["step"], "status": s["status"], "auditors": s["auditors"],
                          "dissenters": s["dissenters"]} for s in cov["per_step"]] if cov else [],
            "evaluations": cov["evaluations"] if cov else [],
            "leaderboard": board, "leaderboard_is_the_statements": board == implied,
            "workdir": str(workdir) if opts.keep else None,
        }
    finally:
        if not opts.keep and opts.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


def trainer_results(run_dir: Path, manifest, trainer: Identity, tamper: int | None) -> list:
    """The trainer's signed results; with ``tamper``, that state's loss has its lowest bit flipped."""
    from open1b.deterministic.device import cpu_device_class
    from open1b.protocol import EvalStatement

    from .evaluations import sign_results

    results = sign_results(run_dir, manifest, trainer, device=cpu_device_class(), now=int(time.time()))
    return [r if r.state != tamper else EvalStatement.create(
        trainer, **{**{f: getattr(r, f) for f in EvalStatement.SCHEMA if f != "signer"},
                    "loss": r.loss ^ 1, "claimed": r.loss ^ 1}) for r in results]


def implied_board(api: str, manifest, redundancy: int) -> list[dict]:
    """The leaderboard computed here, by the protocol library, from the signed statements the
    observer holds (its attestations and evals, fetched raw): what its board must equal."""
    from open1b.protocol import Attestation, EvalStatement, TrustPolicy, leaderboard, public_key_from_peer_id

    run = manifest.run_id.hex()
    atts = [Attestation.decode(bytes.fromhex(a["encoded"])) for a in call(api, f"/v1/attestations/{run}")]
    evals = [EvalStatement.decode(bytes.fromhex(e)) for e in call(api, f"/v1/evals/{run}")]
    p = call(api, f"/v1/coverage/{run}")["policy"]  # the observer's trust policy, applied the same way here
    policy = TrustPolicy(p["name"], frozenset(public_key_from_peer_id(r) for r in p["roots"]), p["quorum"])
    rows = leaderboard([manifest], atts, evals, now=int(time.time()), redundancy=redundancy, policy=policy,
                       min_keys=redundancy)
    return [r.to_json() for r in rows]


def render(summary: dict) -> str:
    lines = [
        f"run        {summary['run']}",
        f"nodes      {summary['nodes']} auditors + 1 observer (coverage read from {summary['queried_from']['peer_id']},"
        f" which replayed {summary['queried_from']['replays']} steps)",
        f"coverage   {summary['verified_steps']}/{summary['steps']} verified, disputed: {summary['disputed_steps'] or 'none'}"
        f" — {'complete' if summary['complete'] else 'INCOMPLETE at deadline'} at redundancy {summary['redundancy']}",
        f"work       {summary['replays']} replays = {summary['replay_ratio']}x steps x redundancy,"
        f" {summary['wall_seconds']} s wall",
        "",
        "step  status     auditors",
    ]
    for s in summary["per_step"]:
        who = ", ".join(p[-8:] for p in s["auditors"]) or "-"
        if s["dissenters"]:
            who += "  mismatch: " + ", ".join(p[-8:] for p in s["dissenters"])
        lines.append(f"{s['step']:>4}  {s['status']:<9}  {who}")
    if summary["evaluations"]:
        lines += ["", "state  evaluation  loss bits  checked by"]
        lines += [f"{e['state']:>5}  {e['status']:<10}  {e['loss_bits'] if e['loss_bits'] is not None else '-'!s:>9}  "
                  f"{', '.join(p[-8:] for p in e['checkers']) or '-'}"
                  + (f"  mismatch: {', '.join(p[-8:] for p in e['dissenters'])}" if e["dissenters"] else "")
                  for e in summary["evaluations"]]
        lines.append(f"leaderboard (observer): {len(summary['leaderboard'])} row(s), "
                     f"{'equal to' if summary['leaderboard_is_the_statements'] else 'DIFFERENT FROM'} the board its"
                     f" statements imply")
    return "\n".join(lines)

