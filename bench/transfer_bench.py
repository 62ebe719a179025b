"""Checkpoint transfer benchmarks (issue 13 item 2): every number against a baseline measured in
the same run, all on loopback in this process.

    .venv/bin/python bench/transfer_bench.py [--quick]

Writes bench/results/transfer.json and prints it. Sections:
* transports: the same bytes moved by a raw TCP socket copy (the baseline), by the libp2p blob
  protocol as it is (/open1b/blob/1.0.0: 1 MiB request/response on one Noise+Yamux stream), by
  libp2p streams pushing 4 MiB frames (one stream, and four in parallel on the one connection),
  and by the bulk path (node/bulk.py) as a plain range download without verification;
* checkpoint: a real checkpoint of a `gpt-125m`-sized state (step 0, ~1.0 GB) fetched by
  ``fetch_checkpoint`` from one provider process (every chunk checked against h_0, written to
  disk, the whole-file address checked), against a raw TCP copy of the same bytes; and the time
  from the call to the first verified chunk (the provider's chunk table computed beforehand, as a
  publisher's or an earlier fetcher's is, and computed on demand);
* providers: a `small` checkpoint fetched from three providers whose upload is capped by a token
  bucket at the same rate, against one such provider.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path

import trio

from open1b.deterministic.config import PRESETS
from open1b.deterministic.runfile import save_checkpoint
from open1b.deterministic.state import init_state
from open1b.node.blobs import BLOB_PROTOCOL, BlobCache
from open1b.node.bulk import OP_RANGE, BulkPeer, open_channel, request, response, serve_bulk
from open1b.node.checkpoint_fetch import fetch_checkpoint
from open1b.node.chunk_table import Expectation, compute_table, state_expectation
from open1b.node.logs import setup_logging
from open1b.node.p2p import open_p2p
from open1b.protocol import Identity
from open1b.protocol.hashing import blake2b256

RESULTS = Path(__file__).parent / "results" / "transfer.json"
PUSH_PROTOCOL = "/open1b/bench-push/1.0.0"
PUSH_FRAME = 4 << 20


async def raw_tcp_copy(payload: bytes | memoryview) -> float:
    """Seconds to send ``payload`` through a loopback TCP socket and receive it (discarded)."""
    received = 0
    done = trio.Event()

    async def sink(stream):
        nonlocal received
        buf = bytearray(1 << 20)
        while received < len(payload):
            n = await stream.socket.recv_into(buf)
            if not n:
                break
            received += n
        done.set()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, sink, 0)
        port = listeners[0].socket.getsockname()[1]
        t = time.perf_counter()
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        view = memoryview(payload)
        for i in range(0, len(payload), 1 << 20):
            await stream.send_all(view[i:i + (1 << 20)])
        await done.wait()
        elapsed = time.perf_counter() - t
        await stream.aclose()
        nursery.cancel_scope.cancel()
    return elapsed


async def libp2p_blob_copy(source: Path, workdir: Path) -> float:
    """Seconds for ``BlobCache.fetch`` over /open1b/blob/1.0.0 between two hosts."""
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(open_p2p(Identity(os.urandom(32)), "127.0.0.1", 0))
        b = await stack.enter_async_context(open_p2p(Identity(os.urandom(32)), "127.0.0.1", 0))
        cache_a = BlobCache(workdir / "blobs-a", 1 << 40)
        a.set_stream_handler(BLOB_PROTOCOL, cache_a.serve)
        digest = cache_a.add_file(source)
        await b.connect(a.addrs[0])
        t = time.perf_counter()
        await BlobCache(workdir / "blobs-b", 1 << 40).fetch(b, digest, [a.peer_id])
        return time.perf_counter() - t


async def libp2p_push(payload: bytes, streams: int) -> float:
    """Seconds for one host to push ``payload`` to another in 4 MiB frames over ``streams``
    parallel libp2p streams (one connection: Noise + Yamux), without any request round trips."""
    share = -(-len(payload) // streams)

    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(open_p2p(Identity(os.urandom(32)), "127.0.0.1", 0))
        b = await stack.enter_async_context(open_p2p(Identity(os.urandom(32)), "127.0.0.1", 0))

        async def pusher(stream) -> None:
            part = int.from_bytes(await stream.receive(8), "little")
            view = memoryview(payload)[part * share:(part + 1) * share]
            for i in range(0, len(view), PUSH_FRAME):
                await stream.send(bytes(view[i:i + PUSH_FRAME]))
            await stream.close()

        a.set_stream_handler(PUSH_PROTOCOL, pusher)
        await b.connect(a.addrs[0])

        async def pull(part: int) -> None:
            stream = await b.open_stream(a.peer_id, PUSH_PROTOCOL)
            await stream.send(part.to_bytes(8, "little"))
            got, want = 0, len(payload[part * share:(part + 1) * share])
            while got < want:
                got += len(await stream.receive(PUSH_FRAME))

        t = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for part in range(streams):
                nursery.start_soon(pull, part)
        return time.perf_counter() - t


async def bulk_range_copy(source: Path, workdir: Path, window: int = 8) -> float:
    """Seconds to download ``source`` over one bulk session as pipelined 1 MiB ranges, kept in
    memory only (the transport alone: no verification, no disk)."""
    server, client = Identity(os.urandom(32)), Identity(os.urandom(32))
    cache = BlobCache(workdir / "bulk-range", 1 << 40)
    digest = cache.add_file(source)
    size = source.stat().st_size
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_bulk, cache, server, "127.0.0.1", 0)
        channel = await open_channel(BulkPeer(server.peer_id, "127.0.0.1", port), client)
        t = time.perf_counter()
        offsets = list(range(0, size, 1 << 20))
        for offset in offsets[:window]:
            await request(channel, OP_RANGE, digest, offset, 1 << 20)
        for i, offset in enumerate(offsets):
            if i + window < len(offsets):
                await request(channel, OP_RANGE, digest, offsets[i + window], 1 << 20)
            await response(channel, min(1 << 20, size - offset))
        elapsed = time.perf_counter() - t
        await channel.aclose()
        nursery.cancel_scope.cancel()
    return elapsed


def write_state_checkpoint(preset: str, workdir: Path) -> tuple[Path, Expectation]:
    """A real checkpoint (state 0 of ``preset``'s model) and what a fetcher expects of it."""
    state = init_state(PRESETS[preset].config, seed=1)
    address = save_checkpoint(workdir / preset, state)
    path = workdir / preset / "checkpoints" / "00000000.safetensors"
    return path, state_expectation(state, address, prev=blake2b256(b"bench-genesis", preset.encode()))


class Providers:
    """Bulk providers of one checkpoint, each a separate process (as another node would be: its
    own interpreter and GIL), serving a cache that holds the file and its chunk table."""

    def __init__(self, path: Path, expect: Expectation, workdir: Path, count: int, rate: float | None,
                 warm_table: bool = True) -> None:
        self.procs, self.peers = [], []
        for i in range(count):
            cache = BlobCache(workdir / f"provider-{i}", 1 << 40)
            cache.add_file(path)
            if warm_table:
                cache.store_table(expect.address, compute_table(path))
            seed = os.urandom(32)
            proc = subprocess.Popen([sys.executable, __file__, "--serve", str(cache.dir), seed.hex(), str(rate or 0)],
                                    stdout=subprocess.PIPE, text=True)
            self.procs.append(proc)
            self.peers.append(BulkPeer(Identity(seed).peer_id, "127.0.0.1", int(proc.stdout.readline())))

    def __enter__(self) -> list[BulkPeer]:
        return self.peers

    def __exit__(self, *exc) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()


def serve(cache_dir: str, seed_hex: str, rate: str) -> None:
    """The provider process: serve ``cache_dir`` on a free loopback port (printed) until killed."""

    async def main() -> None:
        cache = BlobCache(Path(cache_dir), 1 << 40)
        async with trio.open_nursery() as nursery:
            port = await nursery.start(lambda task_status: serve_bulk(
                cache, Identity(bytes.fromhex(seed_hex)), "127.0.0.1", 0, rate_bytes_per_s=float(rate) or None,
                task_status=task_status))
            print(port, flush=True)

    trio.run(main)


def bulk_fetch(path: Path, expect: Expectation, workdir: Path, providers: int, rate: float | None,
               warm_table: bool = True):
    """``fetch_checkpoint`` of ``path`` from ``providers`` provider processes (each capped at
    ``rate`` B/s): its report, and the CPU seconds the fetcher spent."""
    with Providers(path, expect, workdir, providers, rate, warm_table) as peers:
        fetcher = BlobCache(workdir / "fetcher", 1 << 40)
        cpu = time.process_time()
        report = trio.run(fetch_checkpoint, fetcher, Identity(os.urandom(32)), peers, expect)
        return report, time.process_time() - cpu  # this process only: the fetcher's own CPU


def transports(workdir: Path, megabytes: int) -> dict:
    payload = os.urandom(megabytes << 20)
    workdir.mkdir(parents=True, exist_ok=True)
    source = workdir / "payload.bin"
    source.write_bytes(payload)
    raw = trio.run(raw_tcp_copy, payload)
    out = {"megabytes": megabytes, "raw_tcp_mb_s": round(megabytes / raw, 1)}
    for name, seconds in (
        ("libp2p_blob_protocol", trio.run(libp2p_blob_copy, source, workdir)),
        ("libp2p_push_1_stream_4mib_frames", trio.run(libp2p_push, payload, 1)),
        ("libp2p_push_4_streams_4mib_frames", trio.run(libp2p_push, payload, 4)),
        ("bulk_ranges_no_verification", trio.run(bulk_range_copy, source, workdir)),
    ):
        out[f"{name}_mb_s"] = round(megabytes / seconds, 1)
        out[f"{name}_vs_raw_tcp"] = round(raw / seconds, 3)
    return out


def checkpoint(workdir: Path, preset: str) -> dict:
    path, expect = write_state_checkpoint(preset, workdir)
    size = path.stat().st_size
    payload = path.read_bytes()
    raw = trio.run(raw_tcp_copy, payload)
    del payload
    warm, cpu = bulk_fetch(path, expect, workdir / "warm", 1, None)
    cold, _ = bulk_fetch(path, expect, workdir / "cold", 1, None, False)
    return {"preset": preset, "bytes": size,
            "raw_tcp_mb_s": round(size / raw / 1e6, 1),
            "one_provider_mb_s": round(size / warm.seconds / 1e6, 1),
            "one_provider_vs_raw_tcp": round(raw / warm.seconds, 3),
            "fetcher_cpu_ms_per_mb": round(cpu / size * 1e9, 2),
            "first_verified_chunk_s": round(warm.first_verified_s, 4),
            "first_verified_chunk_s_provider_table_cold": round(cold.first_verified_s, 4)}


def providers(workdir: Path, preset: str, rate_mb_s: float) -> dict:
    path, expect = write_state_checkpoint(preset, workdir)
    one, _ = bulk_fetch(path, expect, workdir / "one", 1, rate_mb_s * 1e6)
    three, _ = bulk_fetch(path, expect, workdir / "three", 3, rate_mb_s * 1e6)
    return {"preset": preset, "bytes": path.stat().st_size, "rate_per_provider_mb_s": rate_mb_s,
            "one_provider_mb_s": round(one.size / one.seconds / 1e6, 1),
            "three_providers_mb_s": round(three.size / three.seconds / 1e6, 1),
            "three_vs_one": round(one.seconds / three.seconds, 3),
            "bytes_by_provider": sorted(three.bytes_by_peer.values())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    ap.add_argument("--serve", nargs=3, metavar=("CACHE", "SEED", "RATE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return serve(*args.serve)
    setup_logging("warning")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        results = {
            "transports": transports(workdir / "t", 16 if args.quick else 128),
            "providers": providers(workdir / "p", "tiny" if args.quick else "small", 30.0),
            "checkpoint": checkpoint(workdir / "c", "small" if args.quick else "gpt-125m"),
            "load_average": os.getloadavg(),
        }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
