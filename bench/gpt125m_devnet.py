"""The `gpt-125m` preset end to end on this machine (issue 13 item 1), with every process's peak RSS.

    .venv/bin/python bench/gpt125m_devnet.py [--steps 3] [--nodes 2] [--train-steps 1] [--workdir DIR]

1. ``open1b-node train --preset gpt-125m --ranks 2 --steps S``: two trainer processes
   (torch.distributed, gloo) write a run directory; the wall time and each process's peak RSS.
2. ``open1b-node devnet --preset gpt-125m --nodes N --steps S``: the devnet trains and publishes its
   own run, and N auditor daemons (each with its replay worker) fetch every checkpoint from peers,
   replay and attest until coverage is full; its summary, and the peak RSS of the devnet process
   (which trains), of every daemon and of every replay worker.

Peak RSS is sampled from /proc every 0.2 s for every descendant of the command (VmHWM, the
kernel's own high-water mark, read while the process lives). Writes bench/results/gpt125m.json.
Not a test: it takes many minutes on a small machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "gpt125m.json"
NODE = [sys.executable, "-m", "open1b.node.cli"]
GIB = 1 << 30


def _children(pid: int) -> list[int]:
    try:
        tasks = Path(f"/proc/{pid}/task").iterdir()
        return [int(c) for t in tasks for c in (t / "children").read_text().split()]
    except OSError:
        return []


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(_children(p))
    return out


def _role(pid: int) -> str | None:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    text = b" ".join(argv).decode(errors="replace")
    if "open1b.node.worker" in text:
        return "worker"
    if " daemon" in text:
        return "daemon"
    if " devnet" in text:
        return "devnet (trains in process)"
    if " train" in text or "multiprocessing" in text or "torch" in text:
        return "trainer"
    return None


def _hwm_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_sampled(cmd: list[str], timeout_s: float) -> tuple[subprocess.CompletedProcess, dict[str, float]]:
    """Run ``cmd``; the peak RSS (GiB) per role of its descendants, the largest process of each role."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peaks: dict[str, int] = {}
    done = threading.Event()

    def sample():
        while not done.is_set():
            for pid in _descendants(proc.pid):
                role = _role(pid)
                if role:
                    peaks[role] = max(peaks.get(role, 0), _hwm_bytes(pid))
            done.wait(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        out, err = proc.communicate(timeout=timeout_s)
    finally:
        done.set()
        sampler.join()
        if proc.poll() is None:
            proc.kill()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), {k: round(v / GIB, 2) for k, v in peaks.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3, help="devnet steps")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--train-steps", type=int, default=1, help="steps of the separate 2-rank train (0: skip it)")
    ap.add_argument("--workdir", help="keep everything here (default: a temporary directory)")
    ap.add_argument("--timeout", type=float, default=7200.0)
    args = ap.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="open1b-gpt125m-"))
    workdir.mkdir(parents=True, exist_ok=True)
    results: dict = {"preset": "gpt-125m", "cpu_count": os.cpu_count(), "load_average_1m_at_start": os.getloadavg()[0]}
    if args.train_steps:
        t = time.monotonic()
        done, rss = run_sampled([*NODE, "train", "--json", "--preset", "gpt-125m", "--ranks", "2", "--steps",
                                 str(args.train_steps), "--out", str(workdir / "trained")], args.timeout)  # fmt: skip
        results["train"] = {"ranks": 2, "steps": args.train_steps, "ok": done.returncode == 0,
                            "seconds": round(time.monotonic() - t, 1), "peak_rss_gib": rss,
                            "result": json.loads(done.stdout) if done.returncode == 0 else done.stderr[-2000:]}  # fmt: skip
        print(json.dumps(results["train"], indent=2), flush=True)
    t = time.monotonic()
    done, rss = run_sampled([*NODE, "devnet", "--json", "--preset", "gpt-125m", "--nodes", str(args.nodes), "--steps",
                             str(args.steps), "--deadline", str(args.timeout), "--workdir", str(workdir / "devnet")],
                            args.timeout + 60)  # fmt: skip
    summary = json.loads(done.stdout) if done.stdout.strip().startswith("{") else None
    results["devnet"] = {"nodes": args.nodes, "steps": args.steps, "exit": done.returncode,
                         "seconds": round(time.monotonic() - t, 1), "peak_rss_gib": rss,
                         "summary": summary if summary is not None else done.stderr[-2000:]}  # fmt: skip
    results["all_under_24_gib"] = all(v < 24 for part in ("train", "devnet") if part in results
                                      for v in results[part]["peak_rss_gib"].values())  # fmt: skip
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results["devnet"], indent=2))
    return 0 if done.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
