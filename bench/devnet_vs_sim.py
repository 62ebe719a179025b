"""Validate the scale simulator against reality (issue 6, item 3).

Run a real devnet — N auditor daemons and an observer, separate processes on loopback, the
daemon's own code end to end — then simulate the same configuration: the same N, steps and
redundancy, the daemon's defaults (lease 120 s, idle poll 0.5 s), DHT operation latencies
measured on loopback here, and the gossip latency measured by bench/node_bench.py. What one
replay costs is measured the way the network sees it: the time between an auditor's consecutive
attestations at the observer, and each auditor's start from its first. Compare the
duplicate-work ratio, lost claim races and the time to full coverage as the observer saw it.

    .venv/bin/python bench/scale.py validate      # writes bench/results/scale_validation.json
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import trio

from open1b.deterministic.trainer import publish_run
from open1b.devnet import Daemons
from open1b.node.claim_records import ClaimRecords
from open1b.node.client import call
from open1b.node.p2p import open_p2p
from open1b.protocol import Claim, Identity, claim_key
from open1b.protocol.claims import CLAIM_NAMESPACE
from open1b.sim import NetworkModel, Scenario, simulate
from open1b.sim.hardware import Hardware

NODE_BENCH = Path(__file__).parent / "results" / "node.json"
DEADLINE_S = 300.0


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def _dht_latencies(ops: int) -> dict:
    """Claim-record puts and network gets between three libp2p hosts on loopback."""
    async with open_p2p(Identity(os.urandom(32)), "127.0.0.1", 0) as a, \
            open_p2p(Identity(os.urandom(32)), "127.0.0.1", 0) as b, \
            open_p2p(Identity(os.urandom(32)), "127.0.0.1", 0) as c:
        for node in (a, b, c):
            node.register_record_validator(CLAIM_NAMESPACE, ClaimRecords())
        await b.connect(a.addrs[0])
        await c.connect(a.addrs[0])
        await c.connect(b.addrs[0])
        await trio.sleep(1.0)
        writer = Identity(os.urandom(32))
        run = os.urandom(32)
        puts, gets = [], []
        now = int(time.time())
        for k in range(ops):
            claim = Claim.create(writer, run=run, step=k, slot=0, issued_at=now, lease_expiry=now + 120)
            key = claim_key(run, k, 0)
            t = time.perf_counter()
            await b.put_record(key, claim.encoded)
            puts.append(time.perf_counter() - t)
            t = time.perf_counter()
            got = await c.get_record(key, from_network=True)
            gets.append(time.perf_counter() - t)
            assert got == claim.encoded
    return {"ops": ops, "put_p10_ms": round(_quantile(puts, 0.1) * 1000, 1), "put_p50_ms": round(_quantile(puts, 0.5) * 1000, 1),
            "put_p90_ms": round(_quantile(puts, 0.9) * 1000, 1), "get_p10_ms": round(_quantile(gets, 0.1) * 1000, 1),
            "get_p50_ms": round(_quantile(gets, 0.5) * 1000, 1), "get_p90_ms": round(_quantile(gets, 0.9) * 1000, 1)}


def _devnet_once(run_dir: Path, run_hex: str, workdir: Path, nodes: int, redundancy: int) -> dict:
    workdir.mkdir(parents=True)
    load_before = os.getloadavg()[0]
    daemons = Daemons(workdir, run_dir, redundancy, run_on_all=True)
    addrs = daemons.plan(nodes + 1)
    observer = nodes
    try:
        for i in range(nodes + 1):
            daemons.start(i, audit=i != observer, bootstrap=[addrs[1 if i == 0 else 0]])
        apis = [daemons.api(i) for i in range(nodes + 1)]
        deadline = time.monotonic() + DEADLINE_S
        complete = False
        while time.monotonic() < deadline and not complete:
            complete = call(apis[observer], f"/v1/coverage/{run_hex}?redundancy={redundancy}")["complete"]
            time.sleep(0.2)
        statuses = [call(api, "/v1/status") for api in apis[:observer]]
        atts = call(apis[observer], f"/v1/attestations/{run_hex}")
    finally:
        daemons.stop()
    by_node: dict[str, list[float]] = {}
    for a in atts:
        by_node.setdefault(a["signer"], []).append(a["received_at_ms"] / 1000)
    return {
        "complete": complete,
        "replays": sum(s["replays"] for s in statuses),
        "claims_lost": sum(s["claims_lost"] for s in statuses),
        "received_s": [sorted(ts) for ts in by_node.values()],  # per auditor, as the observer saw them
        "replay_ms": [a["elapsed_ms"] for a in atts],
        # this machine is shared: 2N + 1 processes on few cores make every number here noisier
        "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)], "cpus": os.cpu_count(),
    }


def _timeline(run: dict, cycle: float, nodes: int) -> tuple[float, list[float]]:
    """Coverage time and each auditor's start, as the observer saw them: an auditor starts one
    typical cycle before its first attestation arrives (worker start-up before that is not
    auditing), and coverage runs from the first start to the last attestation. An auditor that
    attested nothing is taken to have started at the end."""
    firsts = [ts[0] - cycle for ts in run["received_s"]]
    t0 = min(firsts)
    end = max(ts[-1] for ts in run["received_s"]) - t0
    return end, [f - t0 for f in firsts] + [end] * (nodes - len(firsts))


def measure(*, nodes: int, steps: int, redundancy: int, repeats: int, seed: int) -> dict:
    """The real side: DHT latency on loopback, then ``repeats`` devnets on one trained run."""
    print("devnet_vs_sim: measuring DHT latency on loopback", flush=True)
    dht = trio.run(_dht_latencies, 30)
    gossip_ms = json.loads(NODE_BENCH.read_text())["gossip"] if NODE_BENCH.exists() else {"p50_ms": 14, "p99_ms": 40}
    with tempfile.TemporaryDirectory(prefix="open1b-validate-") as tmp:
        run_dir = Path(tmp) / "run"
        print(f"devnet_vs_sim: training a {steps}-step run", flush=True)
        manifest = publish_run(run_dir, Identity(os.urandom(32)), steps=steps, seed=seed)
        real = []
        for k in range(repeats):
            print(f"devnet_vs_sim: devnet {k + 1}/{repeats} ({nodes} auditors + observer)", flush=True)
            real.append(_devnet_once(run_dir, manifest.run_id.hex(), Path(tmp) / f"devnet-{k}", nodes, redundancy))
    return {"nodes": nodes, "steps": steps, "redundancy": redundancy, "dht": dht, "gossip_ms": gossip_ms, "devnets": real}


def compare_devnet(raw: dict, *, seed: int) -> dict:
    """The comparison, plus how the simulated side moves if DHT operations on the loaded devnet
    were slower than measured on an idle pair of hosts (they share two cores with 16 processes)."""
    out = _compare(raw, seed=seed)
    out["dht_latency_sensitivity"] = []
    for factor in (10, 30):
        slower = dict(raw, dht={k: v * factor if k.endswith("_ms") else v for k, v in raw["dht"].items()})
        summary = _compare(slower, seed=seed, naive=False)["summary"]
        out["dht_latency_sensitivity"].append({
            "dht_latency_x": factor, "claims_lost_per_run_sim": summary["claims_lost_per_run"]["sim"],
            "coverage_s_sim": summary["coverage_s"].get("sim"), "replay_ratio_sim": summary["replay_ratio"]["sim"]})
    return out


def _compare(raw: dict, *, seed: int, naive: bool = True) -> dict:
    """The simulated side, configured from ``raw`` (see :func:`measure`), and the comparison."""
    nodes, steps, redundancy = raw["nodes"], raw["steps"], raw["redundancy"]
    dht, gossip_ms, real = raw["dht"], raw["gossip_ms"], raw["devnets"]
    # What one replay costs the daemon: the time between an auditor's consecutive attestations
    # (claim, the worker's set-up and replay, signing). The worker's own elapsed_ms leaves out its
    # per-replay set-up (reading the manifest, hashing the corpus, the determinism self-check),
    # which on this machine is most of it.
    cycles = [b - a for r in real for ts in r["received_s"] for a, b in zip(ts, ts[1:])]
    cycle = statistics.median(cycles)
    network = NetworkModel(
        dht_latency_s=(dht["get_p10_ms"] / 1000, dht["get_p90_ms"] / 1000), dht_loss=0.0,
        gossip_latency_s=(gossip_ms["p50_ms"] / 2000, gossip_ms["p99_ms"] / 1000), gossip_loss=0.0,
    )

    def scenario(samples: list[float], starts: tuple[float, ...] = ()) -> Scenario:
        hw = Hardware("devnet daemon", 0.0, samples=tuple(samples))
        return Scenario(nodes=nodes, steps=steps, redundancy=redundancy, mix=((hw, 1.0),), network=network, lease_s=120,
                        idle_poll_s=0.5, crypto="real", start_s=starts)

    ideal = steps * redundancy
    rows = []
    for k, r in enumerate(real):
        devnet_t, starts = _timeline(r, cycle, nodes)
        sims = [simulate(scenario(cycles, tuple(starts)).replace(seed=seed + 100 * k + j)) for j in range(10)]
        rows.append({
            "devnet": {"complete": r["complete"], "replays": r["replays"], "replay_ratio": round(r["replays"] / ideal, 4),
                       "claims_lost": r["claims_lost"], "coverage_s": round(devnet_t, 2),
                       "load_average_1min": r["load_average_1min"], "cpus": r["cpus"]},
            "sim": {"replay_ratio": round(statistics.mean(x["replay_ratio"] for x in sims), 4),
                    "claims_lost": round(statistics.mean(x["claims_lost"] for x in sims), 1),
                    "coverage_s": round(statistics.mean(x["time_to_full_s"] for x in sims), 2),
                    "coverage_s_range": [min(x["time_to_full_s"] for x in sims), max(x["time_to_full_s"] for x in sims)]},
        })
    # For contrast: the simulator fed only the worker's elapsed_ms, every auditor starting at once.
    worker_only = [ms / 1000 for r in real for ms in r["replay_ms"]]
    naive = [simulate(scenario(worker_only).replace(seed=seed + j)) for j in range(10)] if naive else []
    done = [row for row in rows if row["devnet"]["complete"]]
    mean = statistics.mean

    def summary_of(key: str, rows_: list[dict]) -> dict:
        if not rows_:
            return {}
        d, m = mean(row["devnet"][key] for row in rows_), mean(row["sim"][key] for row in rows_)
        return {"devnet": round(d, 4), "sim": round(m, 4), "sim_over_devnet": round(m / d, 4) if d else None}

    return {
        "issue": 6,
        "config": {"nodes": nodes, "steps": steps, "redundancy": redundancy, "lease_s": 120, "idle_poll_s": 0.5},
        "measured": {"dht": dht, "gossip": gossip_ms, "daemon_cycle_s_p50": round(cycle, 3),
                     "daemon_cycle_s_p90": round(_quantile(cycles, 0.9), 3),
                     "worker_elapsed_s_p50": round(statistics.median(ms / 1000 for r in real for ms in r["replay_ms"]), 3)},
        "runs": rows,
        "summary": {
            "complete_devnets": f"{len(done)}/{len(rows)}",
            "replay_ratio": summary_of("replay_ratio", rows),
            "claims_lost_per_run": summary_of("claims_lost", rows),
            "coverage_s": summary_of("coverage_s", done),
            "naive_sim_coverage_s": round(mean(x["time_to_full_s"] for x in naive), 2) if naive else None,
        },
    }
