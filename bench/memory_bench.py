"""Memory of a step at scale (issue 29): peak RSS per parameter of a `gpt-1b` train and replay, of a
`gpt-125m` replay in the node's replay worker, and the time activation recompute costs.

    .venv/bin/python bench/memory_bench.py [--workdir DIR] [--skip-1b] [--skip-125m] [--skip-spot-fetch] [--repeats N]
    .venv/bin/python bench/memory_bench.py --devnet-1b   # the devnet row alone (~33 GB of disk)

1. ``gpt_1b`` (preset ``gpt-1b-one-row``: the `gpt-1b` model, 1 rank x 1 micro-batch x 1 row of
   2,048 tokens): ``open1b-node train --steps 1``, then ``open1b-node replay --step 0``, each a
   child process whose peak RSS is the kernel's (``wait4``'s ``ru_maxrss``); the verdict, the
   times, the checkpoint size, the run's disk use, and the time to scan one checkpoint (its blob
   address and state hash, every chunk hashed, the file read in pieces).
2. ``gpt_125m``: a one-step run (``open1b-node train``), replayed by a real replay worker
   (``python -m open1b.node.worker --device cpu``, the devnet's) whose VmHWM is read from /proc
   after its reply; then ``recompute_time_ratio``: the replay's own time (``ReplayResult.elapsed_s``:
   checkpoint scan, step, hash) with recompute ÷ without, from child processes run alternately,
   each warmed up first so that kernel loading stays out of the timed region.

3. ``spot_fetch_ratio``: the bytes a spot check of a step fetches of checkpoints k and k+1 (the
   header, the chunk table and the chunks it reads) ÷ the two files' bytes (:func:`bench_spot_fetch`).
4. ``gpt_1b_devnet`` (``--devnet-1b``, run alone): a one-step ``gpt-1b-one-row`` run trained by
   ``open1b-node train``, published with ``--move`` through an observer daemon and replayed by one
   auditor daemon (real daemons, their replay workers, over loopback): verified steps, the peak
   RSS of every process (the trainer's from wait4, each daemon's and worker's VmHWM read from
   /proc while they run) and the disk the devnet used (:func:`bench_devnet_1b`).

Writes bench/results/memory.json. Not a test: it takes tens of minutes and ~25 GB of disk. On a
shared machine run it alone: the 1B steps need ~9 GB of memory each.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "memory.json"
NODE = [sys.executable, "-m", "open1b.node.cli"]
PRESET_1B, PRESET_125M = "gpt-1b-one-row", "gpt-125m"


def measured(cmd: list[str], workdir: Path, name: str) -> dict:
    """Run ``cmd`` to completion; its exit code, wall time, stdout and peak RSS (bytes, from wait4:
    the kernel's high-water mark of that process)."""
    out, err = workdir / f"{name}.out", workdir / f"{name}.err"
    started = time.monotonic()
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = subprocess.Popen(cmd, stdout=o, stderr=e)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    result = {"rc": proc.returncode, "seconds": round(time.monotonic() - started, 1),
              "peak_bytes": usage.ru_maxrss * 1024, "stdout": out.read_text()}
    if proc.returncode not in (0, 2):
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {err.read_text()[-2000:]}")
    return result


def _node_json(result: dict) -> dict:
    return json.loads(result.pop("stdout"))


def _n_params(preset: str) -> int:
    from open1b.deterministic import PRESETS

    return PRESETS[preset].config.n_params()


def _disk(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _disk_used(paths: list[Path]) -> int:
    """Bytes on disk under ``paths``: allocated blocks, each file once however many names it has
    (a moved run's files are hard-linked from the node's published directory)."""
    seen, used = set(), 0
    for root in paths:
        for f in root.rglob("*"):
            st = f.lstat()
            if f.is_file() and not f.is_symlink() and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                used += st.st_blocks * 512
    return used


def bench_1b(workdir: Path, preset: str) -> dict:
    n, run = _n_params(preset), workdir / "run-1b"
    data = ["--data-dir", str(workdir / "data")]
    train = measured([*NODE, "train", "--preset", preset, "--steps", "1", "--out", str(run), "--json", *data],
                     workdir, "train-1b")  # fmt: skip
    train["result"] = _node_json(train)
    print(f"gpt-1b train: {train['seconds']} s, peak {train['peak_bytes'] / n:.2f} B/param", flush=True)
    replay = measured([*NODE, "replay", str(run), "--step", "0", "--device", "cpu", "--json", *data], workdir,
                      "replay-1b")  # fmt: skip
    replay["result"] = _node_json(replay)
    print(f"gpt-1b replay: {replay['result']['verdict']}, {replay['seconds']} s, "
          f"peak {replay['peak_bytes'] / n:.2f} B/param", flush=True)
    scan = measured([sys.executable, __file__, "--child-scan", str(run), "--step", "1"], workdir, "scan-1b")
    scan.update(json.loads(scan.pop("stdout")))
    disk = _disk(run)
    shutil.rmtree(run)  # 22 GB
    return {
        "preset": preset, "params": n, "train": train, "replay": replay, "scan_checkpoint": scan,
        "disk_bytes": disk, "match": replay["result"]["verdict"] == "match",
        "train_peak_bytes_per_param": round(train["peak_bytes"] / n, 2),
        "replay_peak_bytes_per_param": round(replay["peak_bytes"] / n, 2),
    }  # fmt: skip


def worker_replay(run: Path, step: int) -> dict:
    """One replay by a replay worker process, as a node runs it; its VmHWM once it has replied."""
    proc = subprocess.Popen([sys.executable, "-m", "open1b.node.worker", "--device", "cpu"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        ready = json.loads(proc.stdout.readline())
        if "error" in ready:
            raise RuntimeError(f"worker did not start: {ready}")
        started = time.monotonic()
        proc.stdin.write(json.dumps({"op": "replay", "run_dir": str(run), "step": step}) + "\n")
        proc.stdin.flush()
        reply = json.loads(proc.stdout.readline())
        seconds = time.monotonic() - started
        status = Path(f"/proc/{proc.pid}/status").read_text()
        hwm = next(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmHWM:"))
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
    if "error" in reply:
        raise RuntimeError(f"worker replay failed: {reply['error']}")
    return {"seconds": round(seconds, 1), "peak_bytes": hwm, "reply": reply}


def bench_125m(workdir: Path, repeats: int, preset: str) -> tuple[dict, dict]:
    from open1b.deterministic.runfile import read_manifest

    n, run = _n_params(preset), workdir / "run-125m"
    train = measured([*NODE, "train", "--preset", preset, "--steps", "1", "--out", str(run), "--json",
                      "--data-dir", str(workdir / "data")], workdir, "train-125m")  # fmt: skip
    train["result"] = _node_json(train)
    print(f"gpt-125m train: {train['seconds']} s, peak {train['peak_bytes'] / n:.2f} B/param", flush=True)
    manifest = read_manifest(run)
    worker = worker_replay(run, 0)
    worker["match"] = bytes.fromhex(worker["reply"]["post_state"]) == manifest.state_hashes[1]
    print(f"gpt-125m worker replay: match {worker['match']}, {worker['seconds']} s, "
          f"peak {worker['peak_bytes'] / n:.2f} B/param", flush=True)
    runs: dict[str, list[dict]] = {"with": [], "without": []}
    for _ in range(repeats):
        for mode in ("with", "without"):  # alternated, so a change in the machine's load hits both
            child = measured([sys.executable, __file__, "--child-replay", str(run), "--step", "0", "--recompute",
                              "1" if mode == "with" else "0"], workdir, f"replay-125m-{mode}")  # fmt: skip
            child.update(json.loads(child.pop("stdout")))
            runs[mode].append(child)
            print(f"gpt-125m replay {mode} recompute: {child['elapsed_s']:.1f} s, "
                  f"peak {child['peak_bytes'] / n:.2f} B/param", flush=True)
    if not all(r["post_state"] == runs["with"][0]["post_state"] for r in runs["with"] + runs["without"]):
        raise RuntimeError("replays with and without recompute disagree")
    shutil.rmtree(run)
    median = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    ratio = median([r["elapsed_s"] for r in runs["with"]]) / median([r["elapsed_s"] for r in runs["without"]])
    gpt125m = {"preset": preset, "params": n, "train": train, "worker_replay": worker,
               "worker_peak_bytes_per_param": round(worker["peak_bytes"] / n, 2),
               "train_peak_bytes_per_param": round(train["peak_bytes"] / n, 2)}  # fmt: skip
    recompute = {"ratio": round(ratio, 3), "with": runs["with"], "without": runs["without"],
                 "peak_bytes_per_param_with": round(median([r["peak_bytes"] for r in runs["with"]]) / n, 2),
                 "peak_bytes_per_param_without": round(median([r["peak_bytes"] for r in runs["without"]]) / n, 2)}
    return gpt125m, recompute


def child_replay(run: Path, step: int, recompute: bool) -> None:
    from open1b.deterministic import init_state, train_step
    from open1b.deterministic.backend import cpu_backend
    from open1b.deterministic.config import GPTConfig, Topology
    from open1b.deterministic.replay import replay

    # warm-up: load (or compile) the parallel CPU kernels on a micro model, outside the timed replay
    micro = GPTConfig(vocab_size=16, seq_len=4, d_model=8, n_layers=1, n_heads=2, d_ff=16, norm_eps=1e-5,
                      init_std=0.5, lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=1.0)
    batch = (__import__("numpy").arange(5, dtype="int32") % 16).reshape(1, 1, 1, 5)
    train_step(init_state(micro, 0), batch, Topology(1, 1, 1), backend=cpu_backend(True), recompute=recompute)
    result = replay(run, step, recompute=recompute)
    print(json.dumps({"elapsed_s": result.elapsed_s, "match": result.match, "post_state": result.post_state.hex(),
                      "self_peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))


def child_scan(run: Path, step: int) -> None:
    from open1b.deterministic.checkpoint_stream import scan_checkpoint
    from open1b.deterministic.runfile import checkpoint_path, read_manifest
    from open1b.deterministic.trainer import config_of

    manifest = read_manifest(run)
    config, _ = config_of(manifest)
    path = checkpoint_path(run, step)
    started = time.perf_counter()
    scan = scan_checkpoint(path, config, step, manifest.checkpoints[step], keep=None)
    root = scan.state_root()
    seconds = time.perf_counter() - started
    size = path.stat().st_size
    print(json.dumps({"checkpoint_bytes": size, "scan_s": round(seconds, 1), "gb_per_s": round(size / seconds / 1e9, 2),
                      "tensors": root[0], "cores": os.cpu_count()}))


def bench_spot_fetch(presets: list[str], challenges: int) -> dict:
    """``spot_fetch_ratio``: what a spot check of step k fetches of checkpoints k and k+1 ÷ the two
    files' bytes, per preset, over ``challenges`` challenge signatures (the worst is the ratio).
    A spot check's fetch (``node.checkpoint_fetch.fetch_checkpoint_part``) receives exactly the
    header, the chunk table and the chunks ``spot_pieces`` names, each once (its test checks
    ``report.size`` against that sum on a real fetch over loopback), so the bytes are counted here
    from the checkpoint's layout, which needs no 11 GB file."""
    from open1b.deterministic import PRESETS
    from open1b.deterministic.checkpoint_stream import canonical_header
    from open1b.deterministic.fingerprint import chunk_count
    from open1b.deterministic.spot_state import AFTER, BEFORE, spot_pieces
    from open1b.node.checkpoint_fetch import wanted_pieces
    from open1b.node.chunk_table import parse_layout
    from open1b.protocol import Identity, blake2b256, challenge_signature
    from open1b.protocol.spotcheck import derive_chunks

    out = {}
    for preset in presets:
        config = PRESETS[preset].config
        layouts = {}
        for step, which in ((0, BEFORE), (1, AFTER)):
            header, slots = canonical_header(config, step)
            layouts[which] = parse_layout(header, len(header) + sum(s.nbytes for s in slots.values()))
        total = sum(layout.size for layout in layouts.values())
        ratios = []
        for i in range(challenges):
            verifier = Identity(blake2b256(b"bench/memory/spot-fetch", i.to_bytes(4, "big")))
            chunks = derive_chunks(challenge_signature(verifier, bytes(32), 0), chunk_count(config))
            fetched = 0
            for which, layout in layouts.items():
                pieces = layout.pieces()
                wanted = wanted_pieces(layout, spot_pieces(config, chunks, which))
                fetched += layout.header_size + layout.table_size + sum(pieces[j].length for j in wanted)
            ratios.append(fetched / total)
        out[preset] = {"checkpoints_bytes": total, "challenges": challenges, "ratio_max": round(max(ratios), 4),
                       "ratio_mean": round(sum(ratios) / len(ratios), 4)}
        print(f"{preset} spot check fetch: {max(ratios):.4f} of the two checkpoints (worst of {challenges})",
              flush=True)
    return out


def _children(pid: int) -> list[int]:
    try:
        tasks = Path(f"/proc/{pid}/task").iterdir()
        return [int(c) for t in tasks for c in (t / "children").read_text().split()]
    except (FileNotFoundError, ProcessLookupError):
        return []


def _hwm(pid: int) -> tuple[str, int] | None:
    """(command line, VmHWM in bytes) of a live process, None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return None
    kb = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), None)
    return None if kb is None else (cmd, kb * 1024)


def bench_devnet_1b(workdir: Path, preset: str, deadline_s: float) -> dict:
    """One step of ``preset`` trained, published (moved) through an observer and verified by one
    auditor: the verdict, each process's peak RSS and the devnet's disk (module doc, 4)."""
    from open1b.devnet.daemons import Daemons
    from open1b.node.client import call, publish

    n, run, data = _n_params(preset), workdir / "run", workdir / "train-data"
    workdir.mkdir(parents=True, exist_ok=True)
    free_at_start = shutil.disk_usage(workdir).free
    lowest_free = [free_at_start]
    train = measured([*NODE, "train", "--preset", preset, "--steps", "1", "--out", str(run), "--json",
                      "--data-dir", str(data)], workdir, "train-devnet")  # fmt: skip
    train["result"] = _node_json(train)
    run_bytes = _disk(run)
    print(f"devnet {preset}: trained in {train['seconds']} s, {run_bytes} bytes", flush=True)
    daemons = Daemons(workdir, run, redundancy=1, device="cpu")
    peaks: dict[int, dict] = {}  # pid -> {"role", "cmd", "peak_bytes"}

    def sample() -> None:
        lowest_free[0] = min(lowest_free[0], shutil.disk_usage(workdir).free)
        for index, proc in enumerate(daemons.procs):
            role = "auditor" if index == 0 else "observer"
            for pid, who in [(proc.pid, f"{role} daemon"), *((c, f"{role} worker") for c in _children(proc.pid))]:
                seen = _hwm(pid)
                if seen is not None:
                    peaks[pid] = {"role": who, "cmd": seen[0][:200], "peak_bytes": seen[1]}

    started = time.monotonic()
    cov = None
    try:
        addrs = daemons.plan(2)
        daemons.start(0, audit=True, bootstrap=[addrs[1]])
        daemons.start(1, audit=False, bootstrap=[addrs[0]])
        api = daemons.api(1)
        job = publish(api, run, lambda job: sample(), timeout=1800, token=daemons.token(1), move=True)
        print(f"devnet {preset}: published (moved: {job['moved']}) in {time.monotonic() - started:.0f} s", flush=True)
        while time.monotonic() < started + deadline_s:
            sample()
            cov = call(api, f"/v1/coverage/{job['run']}?redundancy=1")
            if cov["complete"]:
                break
            time.sleep(2)
        sample()
        statuses = [call(daemons.api(i), "/v1/status") for i in range(2)]
        disk = {"run_dir": _disk_used([run]), **{f"node-{i}": _disk_used([daemons.dirs[i]]) for i in range(2)},
                "all": _disk_used([workdir])}
    finally:
        daemons.stop()
    seconds = time.monotonic() - started
    shutil.rmtree(workdir)  # 33 GB
    processes = [{"role": "trainer (open1b-node train)", "peak_bytes": train["peak_bytes"]}, *peaks.values()]
    for p in processes:
        p["peak_bytes_per_param"] = round(p["peak_bytes"] / n, 2)
    return {
        "preset": preset, "params": n, "train_seconds": train["seconds"], "run_bytes": run_bytes,
        "verified": f"{cov['verified_steps'] if cov else 0}/1", "complete": bool(cov and cov["complete"]),
        "devnet_seconds": round(seconds, 1), "replays": [s["replays"] for s in statuses],
        "fetched_bytes": [s["blobs"]["fetched_bytes"] for s in statuses],
        "processes": processes, "disk_bytes_at_end": disk,
        "disk_bytes_peak": free_at_start - lowest_free[0],
        "note": "disk_bytes_peak is the machine's free-space drop while the devnet ran (shared disk: an upper bound)",
    }  # fmt: skip


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("--workdir", type=Path, default=None)
    cli.add_argument("--skip-1b", action="store_true")
    cli.add_argument("--skip-125m", action="store_true")
    cli.add_argument("--skip-spot-fetch", action="store_true")
    cli.add_argument("--repeats", type=int, default=1)
    cli.add_argument("--devnet-1b", action="store_true", help="run only the one-step gpt-1b devnet row (4)")
    cli.add_argument("--devnet-deadline", type=float, default=5400.0, help="seconds the devnet may take to verify")
    cli.add_argument("--presets", nargs=2, default=[PRESET_1B, PRESET_125M], metavar=("LARGE", "MEDIUM"),
                     help="other presets in place of the two (a quick check of the script; results to --results)")
    cli.add_argument("--results", type=Path, default=RESULTS)
    cli.add_argument("--child-replay", type=Path, help=argparse.SUPPRESS)
    cli.add_argument("--child-scan", type=Path, help=argparse.SUPPRESS)
    cli.add_argument("--step", type=int, default=0, help=argparse.SUPPRESS)
    cli.add_argument("--recompute", type=int, default=1, help=argparse.SUPPRESS)
    args = cli.parse_args()
    if args.child_replay:
        return child_replay(args.child_replay, args.step, bool(args.recompute))
    if args.child_scan:
        return child_scan(args.child_scan, args.step)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="memory-bench-", dir="/var/tmp"))
    workdir.mkdir(parents=True, exist_ok=True)
    out = args.results
    results = json.loads(out.read_text()) if out.exists() else {}
    if args.devnet_1b:
        results["gpt_1b_devnet"] = bench_devnet_1b(workdir / "devnet-1b", args.presets[0], args.devnet_deadline)
        out.write_text(json.dumps(results, indent=1) + "\n")
        print(json.dumps(results["gpt_1b_devnet"], indent=1))
        return
    if not (args.skip_1b and args.skip_125m):  # what the timed rows ran on (the byte counts need no machine)
        results["machine"] = {"cores": os.cpu_count(), "load_average_at_start": os.getloadavg()}
    if not args.skip_1b:
        results["gpt_1b"] = bench_1b(workdir, args.presets[0])
        out.write_text(json.dumps(results, indent=1) + "\n")
    if not args.skip_125m:
        results["gpt_125m"], results["recompute"] = bench_125m(workdir, args.repeats, args.presets[1])
        results["recompute_time_ratio"] = results["recompute"]["ratio"]
        out.write_text(json.dumps(results, indent=1) + "\n")
    if not args.skip_spot_fetch:
        results["spot_fetch"] = bench_spot_fetch([PRESET_1B, PRESET_125M, "small"], challenges=64)
        results["spot_fetch_ratio"] = results["spot_fetch"][PRESET_1B]["ratio_max"]
        out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps({k: results[k] for k in ("recompute_time_ratio", "spot_fetch_ratio") if k in results}))


if __name__ == "__main__":
    main()
