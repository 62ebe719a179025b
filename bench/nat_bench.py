"""Checkpoint fetches over real, shaped links (issue 27 item 6): seeders at home behind NAT routers
whose uplinks are capped at 40 Mbit/s, a fetcher on the internet with an uncapped downlink, every
process in its own network namespace (devnet/nat_topology.py; needs root, iproute2, iptables).

    .venv/bin/python bench/nat_bench.py [--quick]

Writes bench/results/nat.json and prints it. Each seeder's home forwards its bulk port (as a UPnP
mapping would), so the fetcher dials it through the NAT; the fetch is the product's
(``fetch_checkpoint`` over node/bulk.py sessions, every chunk checked against h_k, written to disk,
the whole-file address checked). Numbers:

* ``one_seeder_goodput_vs_link``: checkpoint bytes ÷ the fetch's wall time, over the link's
  nominal 40 Mbit/s (which counts Ethernet/IP/TCP headers too, so ~0.96 is the ceiling);
* ``one_seeder_goodput_vs_raw_tcp``: the same goodput over a plain TCP socket's through the same
  shaped path, measured in the same run (the baseline);
* ``three_seeders_vs_one``: the fetch time from one seeder over that from three, each behind its
  own 40 Mbit/s uplink (one of the three behind a ``--random-fully`` NAT).

Every home's WAN link carries a 25 ms delay each way (a 50 ms round trip; devnet/delay_line.py,
as this kernel has no ``netem``); ``without_added_latency`` repeats the measurement without it
(round trips: veth's, well under a millisecond, plus the shaper's queue of at most 50 ms).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

from open1b.devnet.nat_topology import HomeSpec, NatTopology
from open1b.node.blobs import BlobCache
from open1b.node.bulk import BulkPeer, serve_bulk
from open1b.node.checkpoint_fetch import fetch_checkpoint
from open1b.node.chunk_table import compute_table
from open1b.node.logs import setup_logging
from open1b.protocol import Identity

sys.path.insert(0, str(Path(__file__).parent))
from transfer_bench import write_state_checkpoint  # noqa: E402  (bench/ is not a package)

RESULTS = Path(__file__).parent / "results" / "nat.json"
LINK_MBIT = 40.0
PORT = 7700  # each seeder's bulk port, forwarded by its home router
DELAY_MS = 25.0
"""One-way delay between each home's router and the internet (a 50 ms round trip: a home uplink
to a peer a few countries away)."""


def serve(cache_dir: str, seed_hex: str, host: str) -> None:
    """A seeder (run inside its home's namespace): serve ``cache_dir`` on ``host:PORT``; prints
    ``ready`` once listening, then serves until killed."""

    async def main() -> None:
        cache = BlobCache(Path(cache_dir), 1 << 40)
        async with trio.open_nursery() as nursery:
            await nursery.start(lambda task_status: serve_bulk(
                cache, Identity(bytes.fromhex(seed_hex)), host, PORT, task_status=task_status))
            print("ready", flush=True)

    trio.run(main)


def fetch(workdir: str, expect_file: str, peers_json: str) -> None:
    """The fetcher (run inside the internet's namespace): ``fetch_checkpoint`` from the peers;
    prints its report as JSON."""
    expect = pickle.loads(Path(expect_file).read_bytes())
    peers = [BulkPeer(*p) for p in json.loads(peers_json)]
    report = trio.run(fetch_checkpoint, BlobCache(Path(workdir), 1 << 40), Identity(os.urandom(32)), peers, expect)
    print(json.dumps({"bytes": report.size, "seconds": report.seconds,
                      "bytes_by_peer": sorted(report.bytes_by_peer.values())}), flush=True)


def raw_send(host: str, size: str) -> None:
    """The baseline's sender (in a seeder's home): accept one connection on ``host:PORT``, send
    ``size`` zero bytes, close."""
    server = socket.create_server((host, PORT))
    print("ready", flush=True)
    conn, _ = server.accept()
    conn.sendall(bytes(int(size)))
    conn.close()


def raw_receive(host: str) -> None:
    """The baseline's receiver (on the internet): connect, read to the end, print bytes and seconds."""
    started = time.perf_counter()
    conn = socket.create_connection((host, PORT), timeout=60)
    buf, got = bytearray(1 << 20), 0
    while n := conn.recv_into(buf):
        got += n
    print(json.dumps({"bytes": got, "seconds": time.perf_counter() - started}), flush=True)


def _in(site, *args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([*site.prefix, sys.executable, __file__, *args], stdout=subprocess.PIPE, text=True,
                            **kwargs)


def _result(proc: subprocess.Popen) -> dict:
    out, _ = proc.communicate(timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
    return json.loads(out.strip().splitlines()[-1])


def _ready(proc: subprocess.Popen) -> subprocess.Popen:
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        raise RuntimeError(f"{proc.args} did not start")
    return proc


def measure(workdir: Path, preset: str, raw_bytes: int, delay_ms: float) -> dict:
    workdir.mkdir(parents=True)
    path, expect = write_state_checkpoint(preset, workdir)
    expect_file = workdir / "expect.pickle"
    expect_file.write_bytes(pickle.dumps(expect))
    table = compute_table(path)
    homes = [HomeSpec(f"s{i}", nat="random" if i == 3 else "port-preserving", uplink_mbit=LINK_MBIT, forwards=(PORT,),
                      delay_ms=delay_ms) for i in (1, 2, 3)]
    with NatTopology(homes) as net:
        sites = [net.homes[h.name] for h in homes]
        sender = _ready(_in(sites[0], "--raw-send", sites[0].address, str(raw_bytes)))
        raw = _result(_in(net.internet, "--raw-receive", sites[0].public_address))
        sender.wait(timeout=60)

        seeders, peers = [], []
        try:
            for i, site in enumerate(sites):
                cache = BlobCache(workdir / f"seeder-{i}", 1 << 40)
                cache.add_file(path)
                cache.store_table(expect.address, table)
                seed = os.urandom(32)
                seeders.append(_ready(_in(site, "--serve", str(cache.dir), seed.hex(), site.address)))
                peers.append((Identity(seed).peer_id, site.public_address, PORT))
            one = _result(_in(net.internet, "--fetch", str(workdir / "fetch-one"), str(expect_file),
                              json.dumps(peers[:1])))
            three = _result(_in(net.internet, "--fetch", str(workdir / "fetch-three"), str(expect_file),
                                json.dumps(peers)))
        finally:
            for proc in seeders:
                proc.kill()
                proc.wait()
    link = LINK_MBIT * 1e6 / 8
    raw_rate, one_rate = raw["bytes"] / raw["seconds"], one["bytes"] / one["seconds"]
    return {
        "preset": preset,
        "checkpoint_bytes": one["bytes"],
        "link_mbit_s": LINK_MBIT,
        "round_trip_added_ms": 2 * delay_ms,
        "raw_tcp_mbit_s": round(raw_rate * 8 / 1e6, 2),
        "raw_tcp_vs_link": round(raw_rate / link, 3),
        "one_seeder_mbit_s": round(one_rate * 8 / 1e6, 2),
        "one_seeder_goodput_vs_link": round(one_rate / link, 3),
        "one_seeder_goodput_vs_raw_tcp": round(one_rate / raw_rate, 3),
        "three_seeders_mbit_s": round(three["bytes"] / three["seconds"] * 8 / 1e6, 2),
        "three_seeders_vs_one": round(one["seconds"] / three["seconds"], 3),
        "three_seeders_bytes_by_seeder": three["bytes_by_peer"],
        "seconds": {"raw_tcp": round(raw["seconds"], 2), "one_seeder": round(one["seconds"], 2),
                    "three_seeders": round(three["seconds"], 2)},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="a small checkpoint (a smoke run)")
    ap.add_argument("--serve", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--fetch", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--raw-send", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--raw-receive", nargs=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    for role, run in (("serve", serve), ("fetch", fetch), ("raw_send", raw_send), ("raw_receive", raw_receive)):
        if getattr(args, role):
            setup_logging("warning")
            return run(*getattr(args, role))
    setup_logging("warning")
    preset, raw = ("tiny", 8 << 20) if args.quick else ("small", 40 << 20)
    with tempfile.TemporaryDirectory() as tmp:
        results = measure(Path(tmp) / "delayed", preset, raw, DELAY_MS)
        results["without_added_latency"] = measure(Path(tmp) / "direct", preset, raw, 0.0)
    results["load_average"] = os.getloadavg()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
