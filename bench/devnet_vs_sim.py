"""Validate the scale simulator against reality (issue 6, item 3).

Run a real devnet — N auditor daemons and an observer, separate processes on loopback, the
daemon's own code end to end — then simulate the same configuration: the same N, steps and
redundancy, the daemon's defaults (lease 120 s, idle poll 0.5 s), the replay times the devnet's
workers actually reported (``elapsed_ms`` in their attestations), DHT operation latencies
measured on loopback here, and the gossip latency measured by bench/node_bench.py. Compare
the duplicate-work ratio, lost claim races and the time from the first replay's start to full
coverage as the observer saw it.

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
from open1b.node.client import call
from open1b.node.daemon import ClaimRecords
from open1b.node.devnet import Daemons
from open1b.node.p2p import open_p2p
from open1b.node.sim import NetworkModel, Scenario, simulate
from open1b.node.sim.hardware import Hardware
from open1b.protocol import Claim, Identity, claim_key
from open1b.protocol.claims import CLAIM_NAMESPACE

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
    daemons = Daemons(workdir, run_dir, redundancy)
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
    starts = [a["received_at_ms"] - a["elapsed_ms"] for a in atts]
    return {
        "complete": complete,
        "replays": sum(s["replays"] for s in statuses),
        "claims_lost": sum(s["claims_lost"] for s in statuses),
        "coverage_s": round((max(a["received_at_ms"] for a in atts) - min(starts)) / 1000, 3),
        "replay_ms": [a["elapsed_ms"] for a in atts],
        # this machine is shared: 2N + 1 processes on few cores make every number here noisier
        "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)], "cpus": os.cpu_count(),
    }


def compare_devnet(*, nodes: int, steps: int, redundancy: int, repeats: int, seed: int) -> dict:
    print(f"devnet_vs_sim: measuring DHT latency on loopback", flush=True)
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
    durations = tuple(ms / 1000 for r in real for ms in r["replay_ms"])
    network = NetworkModel(
        dht_latency_s=(dht["get_p10_ms"] / 1000, dht["get_p90_ms"] / 1000), dht_loss=0.0,
        gossip_latency_s=(gossip_ms["p50_ms"] / 2000, gossip_ms["p99_ms"] / 1000), gossip_loss=0.0,
    )
    base = Scenario(nodes=nodes, steps=steps, redundancy=redundancy, mix=((Hardware("devnet worker", 0.0, samples=durations), 1.0),),
                    network=network, lease_s=120, idle_poll_s=0.5, crypto="real")
    sims = [simulate(base.replace(seed=seed + k)) for k in range(20)]
    ideal = steps * redundancy
    real_ratio = statistics.mean(r["replays"] / ideal for r in real)
    sim_ratio = statistics.mean(s["replay_ratio"] for s in sims)
    real_t = statistics.mean(r["coverage_s"] for r in real)
    sim_t = statistics.mean(s["time_to_full_s"] - s["first_replay_start_s"] for s in sims)
    return {
        "issue": 6,
        "config": {"nodes": nodes, "steps": steps, "redundancy": redundancy, "lease_s": 120, "idle_poll_s": 0.5},
        "measured": {"dht": dht, "gossip": gossip_ms, "replay_s_p50": round(statistics.median(durations), 3),
                     "replay_s_p90": round(_quantile(list(durations), 0.9), 3)},
        "devnet": [{k: v for k, v in r.items() if k != "replay_ms"} | {"replay_ratio": round(r["replays"] / ideal, 4)}
                   for r in real],
        "simulated": [{"seed": s["scenario"]["seed"], "replay_ratio": s["replay_ratio"], "claims_lost": s["claims_lost"],
                       "coverage_s": round(s["time_to_full_s"] - s["first_replay_start_s"], 3)} for s in sims],
        "summary": {
            "replay_ratio": {"devnet": round(real_ratio, 4), "sim": round(sim_ratio, 4), "difference": round(sim_ratio - real_ratio, 4)},
            "claims_lost_per_replay": {
                "devnet": round(statistics.mean(r["claims_lost"] / r["replays"] for r in real), 4),
                "sim": round(statistics.mean(s["claims_lost"] / s["replays"] for s in sims), 4)},
            "coverage_s": {"devnet": round(real_t, 2), "sim": round(sim_t, 2), "sim_over_devnet": round(sim_t / real_t, 3)},
        },
    }
