"""Node benchmarks (issue 4): every number is a ratio against a baseline measured in the same run.

    .venv/bin/python bench/node_bench.py [--quick]

Writes bench/results/node.json and prints a table:
* ingest: attestations validated and stored per second by a node's real ingest path, vs the raw
  pynacl Ed25519 verify rate over the same signatures;
* gossip: propagation latency p50/p99 from one publisher to 8 daemon processes (the daemons'
  own receive timestamps, read through their API);
* transfer: checkpoint-sized blob fetched over /open1b/blob/1.0.0 (Noise + Yamux, chunked,
  verified) vs a raw TCP socket copy of the same bytes, both on loopback in one process (the bulk
  path for checkpoints is measured by bench/transfer_bench.py);
* idle: CPU share and RSS of an idle daemon.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import nacl.signing
import trio
from transfer_bench import libp2p_blob_copy, raw_tcp_copy

from open1b.deterministic.trainer import publish_run
from open1b.devnet import Daemons
from open1b.node.client import call
from open1b.node.clock import Clock
from open1b.node.config import NodeConfig
from open1b.node.ledger import build_ledger
from open1b.node.logs import setup_logging
from open1b.node.metrics import NodeStats
from open1b.node.p2p import open_p2p
from open1b.node.store import Store
from open1b.node.topics import attestations_topic
from open1b.protocol import Attestation, Identity, RunManifest, signing
from open1b.protocol.hashing import blake2b256
from open1b.protocol.witness import witness_binding

RESULTS = Path(__file__).parent / "results" / "node.json"


def attestations(manifest: RunManifest, signers: int) -> list[Attestation]:
    now = int(time.time())
    out = []
    for i in range(signers):
        ident = Identity(blake2b256(b"bench-signer", i.to_bytes(4, "little")))
        for k in range(manifest.steps):
            out.append(Attestation.create(
                ident, run=manifest.run_id, step=k, pre_state=manifest.state_hashes[k],
                post_state=manifest.state_hashes[k + 1], verdict="match", engine=manifest.engine,
                engine_version=manifest.engine_version, hardware="bench", device="cpu/x86_64-avx2", elapsed_ms=1, issued_at=now,
                witness=witness_binding(manifest.run_id, k, ident.public_key, blake2b256(b"bench-witness"))))
    return out


class _NoGossip:
    """The ledger's network side, unused when statements arrive by direct calls."""

    def set_validator(self, topic, validator):
        pass

    async def subscribe(self, topic, handler):
        pass

    async def publish(self, topic, data):
        pass

    def penalise(self, peer_id):
        pass


def bench_ingest(manifest: RunManifest, workdir: Path, signers: int) -> dict:
    atts = attestations(manifest, signers)
    keys = [nacl.signing.VerifyKey(a.signer) for a in atts]
    messages = [signing.signing_bytes(a.KIND, a.body()) for a in atts]
    t = time.perf_counter()
    for key, message, att in zip(keys, messages, atts):
        key.verify(message, att.sig)
    raw = len(atts) / (time.perf_counter() - t)
    (workdir / "ingest").mkdir(parents=True, exist_ok=True)
    store = Store(workdir / "ingest" / "store.sqlite")
    store.add_manifest(manifest)
    ledger = build_ledger(Identity(os.urandom(32)), NodeConfig(data_dir=workdir / "ingest"), store, _NoGossip(),
                          clock=Clock(), stats=NodeStats())
    t = time.perf_counter()
    new = ledger.statements.ingest_attestations([a.encoded for a in atts])  # a sync response's batch
    rate = len(atts) / (time.perf_counter() - t)
    assert new == len(atts)
    return {"attestations": len(atts), "raw_verify_per_s": round(raw), "ingest_per_s": round(rate),
            "ingest_vs_raw_verify": round(rate / raw, 3)}


async def _publish(addrs: list[str], run: bytes, atts: list[Attestation], rate: float) -> dict[bytes, float]:
    sent = {}
    async with open_p2p(Identity(os.urandom(32)), "127.0.0.1", 0) as p2p:
        for addr in addrs:
            await p2p.connect(addr)
        topic = attestations_topic(run)

        async def ignore(author, data):
            pass

        await p2p.subscribe(topic, ignore)
        with trio.fail_after(30):
            while p2p.topic_peers(topic) < len(addrs) // 2:
                await trio.sleep(0.1)
        await trio.sleep(2.5)  # let the mesh settle (heartbeat is 1 s)
        for att in atts:
            sent[att.digest] = time.time()
            await p2p.publish(topic, att.encoded)
            await trio.sleep(1 / rate)
        await trio.sleep(3)
    return sent


def bench_gossip(run_dir: Path, manifest: RunManifest, workdir: Path, nodes: int, signers: int) -> dict:
    daemons = Daemons(workdir / "gossip", run_dir, redundancy=1, run_on_all=True)
    (workdir / "gossip").mkdir()
    addrs = daemons.plan(nodes)
    try:
        for i in range(nodes):
            daemons.start(i, audit=False, bootstrap=[addrs[(i + 1) % nodes]])
        apis = [daemons.api(i) for i in range(nodes)]
        time.sleep(3)
        atts = attestations(manifest, signers)
        sent = trio.run(_publish, addrs, manifest.run_id, atts, 20.0)
        latencies, missing = [], 0
        for api in apis:
            received = {bytes.fromhex(a["digest"]): a["received_at_ms"] for a in call(api, f"/v1/attestations/{manifest.run_id.hex()}")}
            for digest, t in sent.items():
                if digest in received:
                    latencies.append(received[digest] - t * 1000)
                else:
                    missing += 1
    finally:
        daemons.stop()
    latencies.sort()
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [float("nan")] * 99
    return {"daemons": nodes, "messages": len(atts), "deliveries": len(latencies), "missing": missing,
            "p50_ms": round(q[49], 1), "p99_ms": round(q[98], 1), "max_ms": round(latencies[-1], 1)}


def bench_transfer(workdir: Path, megabytes: int) -> dict:
    payload = os.urandom(megabytes << 20)
    source = workdir / "blob.bin"
    source.write_bytes(payload)
    raw = trio.run(raw_tcp_copy, payload)
    blob = trio.run(libp2p_blob_copy, source, workdir)
    return {"megabytes": megabytes, "raw_tcp_mb_s": round(megabytes / raw, 1), "blob_mb_s": round(megabytes / blob, 1),
            "blob_vs_raw_tcp": round(raw / blob, 3)}


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def bench_idle(run_dir: Path, workdir: Path, seconds: float) -> dict:
    daemons = Daemons(workdir / "idle", run_dir, redundancy=1, run_on_all=True)
    (workdir / "idle").mkdir()
    daemons.plan(1)
    try:
        daemons.start(0, audit=False, bootstrap=[])
        daemons.api(0)
        time.sleep(3)
        pid = daemons.procs[0].pid
        c0, t0 = _cpu_seconds(pid), time.monotonic()
        time.sleep(seconds)
        cpu = (_cpu_seconds(pid) - c0) / (time.monotonic() - t0)
        rss = _rss_mb(pid)
    finally:
        daemons.stop()
    return {"seconds": seconds, "cpu_percent": round(100 * cpu, 2), "rss_mb": round(rss, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    args = ap.parse_args()
    setup_logging("warning")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        run_dir = workdir / "run"
        manifest = publish_run(run_dir, Identity(os.urandom(32)), steps=8)
        results = {
            "ingest": bench_ingest(manifest, workdir, signers=25 if args.quick else 250),
            "gossip": bench_gossip(run_dir, manifest, workdir, nodes=8, signers=5 if args.quick else 25),
            "transfer": bench_transfer(workdir, megabytes=16 if args.quick else 128),
            "idle": bench_idle(run_dir, workdir, seconds=5 if args.quick else 20),
        }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    for section, values in results.items():
        print(f"{section:<8}" + "  ".join(f"{k}={v}" for k, v in values.items()))


if __name__ == "__main__":
    main()
