"""``open1b-node devnet`` without scenarios: a whole audit on one machine, with real daemon processes.

1. train a fresh run into a directory (optionally forging the state after one step, and with a
   held-out evaluation set whose results the trainer signs, optionally one of them false);
2. start N auditor daemons and one observer daemon (audits nothing) as separate OS processes on
   127.0.0.1, all bootstrapping from the first; no daemon is given the run directory;
3. publish the run through the observer's API, exactly as ``open1b-node publish`` does: the
   observer checks and serves the files and gossips the manifest, and every auditor fetches the
   checkpoints and samples it replays from peers (docs/run-format.md §6);
4. poll the observer's API until every step has ``redundancy`` distinct attesters and every
   evaluation is certified or disputed, or a deadline;
5. read coverage from the observer — a node that replayed nothing, so everything it reports
   reached it over the network — shut every daemon down through its API, and summarise.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from open1b.deterministic.device import select_device_or_cpu
from open1b.deterministic.trainer import publish_run
from open1b.node.client import call
from open1b.node.progress import progress
from open1b.protocol import Identity

from .daemons import Daemons, say
from .evaluations import implied_board, render_evaluations, trainer_results
from .options import EVAL_DOCUMENTS, DevnetOptions


def run_plain(opts: DevnetOptions) -> dict:
    started = time.monotonic()
    workdir = opts.workdir or Path(tempfile.mkdtemp(prefix="open1b-devnet-"))
    workdir.mkdir(parents=True, exist_ok=True)
    run_dir = workdir / "run"
    try:
        forged = f" (state after step {opts.tamper_step} forged)" if opts.tamper_step is not None else ""
        with progress(f"devnet: training and publishing a run{forged}", opts.steps) as update:
            trainer = Identity(os.urandom(32))
            manifest = publish_run(run_dir, trainer, steps=opts.steps, seed=opts.seed, preset=opts.preset,
                                   tamper_step=opts.tamper_step,
                                   eval_documents=EVAL_DOCUMENTS if opts.eval_every else 0,
                                   eval_every=opts.eval_every or 1, device=select_device_or_cpu(opts.device),
                                   progress=lambda done, total: update(done, ""))
        run_hex = manifest.run_id.hex()
        daemons = Daemons(workdir, run_dir, opts.redundancy, device=opts.device)
        try:
            addrs = daemons.plan(opts.nodes + 1)
            observer = opts.nodes
            for i in range(opts.nodes + 1):
                daemons.start(i, audit=i != observer, bootstrap=[addrs[1 if i == 0 else 0]])
            apis = [daemons.api(i) for i in range(opts.nodes + 1)]
            job = daemons.publish(observer)
            say(f"{opts.nodes} auditors and 1 observer up in {run_dir.parent}; run {run_hex[:16]}… published by the"
                 f" observer ({job['bytes']} bytes in {job['steps'] + 2} blobs, {job['seconds']} s); auditors fetch from peers")
            if opts.eval_every:  # the trainer signs its results with the run's key; the observer gossips them
                for result in trainer_results(run_dir, manifest, trainer, opts.tamper_eval):
                    call(apis[observer], f"/v1/eval?statement={result.encoded.hex()}", method="POST",
                         token=daemons.token(observer))
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
            # docs/protocol.md §8.7: P(a forged run escaped the replays and spot checks so far)
            "escape_one_forged": cov["spot_checks"]["escape_one_forged"] if cov else 1.0,
            "escape_one_percent_forged": cov["spot_checks"]["escape_one_percent_forged"] if cov else 1.0,
            "tamper_step": opts.tamper_step,
            "replays": replays, "replay_ratio": round(replays / (opts.steps * opts.redundancy), 4),
            "wall_seconds": round(wall, 2),
            "queried_from": {"peer_id": statuses[-1]["peer_id"], "replays": statuses[-1]["replays"]},
            "per_node": [{"peer_id": s["peer_id"], "replays": s["replays"], "claims_lost": s["claims_lost"],
                          "audit": s["audit"], "device": s["device"]["class"], "fetched_bytes": s["blobs"]["fetched_bytes"],
                          "served_bytes": s["blobs"]["served_bytes"]} for s in statuses],
            "per_step": [{"step": s["step"], "status": s["status"], "auditors": s["auditors"],
                          "dissenters": s["dissenters"], "devices": s["devices"]} for s in cov["per_step"]] if cov else [],
            "evaluations": cov["evaluations"] if cov else [],
            "leaderboard": board, "leaderboard_is_the_statements": board == implied,
            "workdir": str(workdir) if opts.keep else None,
        }
    finally:
        if not opts.keep and opts.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


def render(summary: dict) -> str:
    lines = [
        f"run        {summary['run']}",
        f"nodes      {summary['nodes']} auditors + 1 observer (coverage read from {summary['queried_from']['peer_id']},"
        f" which replayed {summary['queried_from']['replays']} steps)",
        f"coverage   {summary['verified_steps']}/{summary['steps']} verified, disputed: {summary['disputed_steps'] or 'none'}"
        f" — {'complete' if summary['complete'] else 'INCOMPLETE at deadline'} at redundancy {summary['redundancy']}",
        f"escape     {summary['escape_one_forged']:.3g} with one forged step, {summary['escape_one_percent_forged']:.3g}"
        " with 1% of the steps forged (docs/protocol.md §8.7)",
        f"work       {summary['replays']} replays = {summary['replay_ratio']}x steps x redundancy,"
        f" {summary['wall_seconds']} s wall",
        f"devices    {', '.join(sorted({d for s in summary['per_step'] for d in s['devices']})) or '-'}"
        " (the classes of device behind the matches)",
        "",
        "step  status     auditors",
    ]
    for s in summary["per_step"]:
        who = ", ".join(p[-8:] for p in s["auditors"]) or "-"
        if s["dissenters"]:
            who += "  mismatch: " + ", ".join(p[-8:] for p in s["dissenters"])
        lines.append(f"{s['step']:>4}  {s['status']:<9}  {who}")
    return "\n".join(lines + render_evaluations(summary))

