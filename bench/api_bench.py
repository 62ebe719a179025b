"""The local API's cost (issue 16): idle RSS of a daemon and the latency of its API.

    .venv/bin/python bench/api_bench.py [--label NAME] [--requests N]

Starts one real ``open1b-node daemon`` (no audit, no peers), waits until it has been idle for
a few seconds, reads its resident set from /proc, then times ``--requests`` sequential
``GET /v1/status`` calls over fresh connections (what the CLI does) and, as the baseline measured
in the same run, the same number of TCP connects to the same port. Writes
bench/results/api_<label>.json.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from open1b.node.client import call
from open1b.node.daemon import API_ADDR_FILE
from open1b.node.datadir import init_data_dir

RESULTS = Path(__file__).parent / "results"
IDLE_S = 5.0


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def percentile(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--label", default="now")
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "node"
        init_data_dir(data_dir)
        proc = subprocess.Popen([sys.executable, "-m", "open1b.node.cli", "daemon", "--data-dir", str(data_dir),
                                 "--listen", "127.0.0.1:0", "--api", "127.0.0.1:0", "--no-audit"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while not (data_dir / API_ADDR_FILE).exists():
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit("the daemon did not start")
                time.sleep(0.05)
            api = (data_dir / API_ADDR_FILE).read_text().strip()
            time.sleep(IDLE_S)
            rss = rss_kib(proc.pid)
            host, port = api.rsplit(":", 1)
            connect, status = [], []
            for _ in range(args.requests):
                t = time.perf_counter()
                socket.create_connection((host, int(port))).close()
                connect.append(time.perf_counter() - t)
                t = time.perf_counter()
                call(api, "/v1/status")
                status.append(time.perf_counter() - t)
        finally:
            proc.terminate()
            proc.wait(timeout=15)
    ms = lambda xs, q: round(1000 * percentile(xs, q), 3)  # noqa: E731
    result = {"label": args.label, "idle_rss_mib": round(rss / 1024, 1), "requests": args.requests,
              "status_ms_p50": ms(status, 0.5), "status_ms_p95": ms(status, 0.95),
              "connect_ms_p50": ms(connect, 0.5),
              "status_over_connect_p50": round(statistics.median(status) / statistics.median(connect), 1)}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"api_{args.label}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
