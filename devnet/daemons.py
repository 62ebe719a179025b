"""The daemon processes of a devnet (:class:`Daemons`): real ``open1b-node daemon`` processes on
127.0.0.1 (or in network namespaces), started, published through, killed and stopped. An
adversary is the same daemon started through :mod:`.daemon_entry`."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from open1b.node.client import ApiUnavailable, call, publish
from open1b.node.daemon import API_ADDR_FILE
from open1b.node.datadir import init_data_dir, read_api_token

from .adversaries import ENV_SWITCH as DEVNET_ENV
from .options import DevnetError

# A bound on waiting for a daemon's address file (it ends when the file appears): generous, since
# a daemon started beside another devnet on a shared machine takes many times its quiet start-up.
START_TIMEOUT_S = 180.0
PUBLISH_STALL_S = 300.0  # a publish job that makes no progress for this long has failed
STOP_TIMEOUT_S = 15.0


class Daemons:
    """The daemon processes of a devnet; stops them all on exit, whatever happened.

    :meth:`plan` initialises every data directory (so each node's peer ID is known) and reserves
    a listen port per node before anything starts; then all daemons can start at once, each
    bootstrapping from another, and none audits alone while the others are still starting.

    A port on 127.0.0.1 stays reserved until :meth:`stop`: a socket bound to it (SO_REUSEADDR,
    never listening) is held, so the kernel hands it to no other socket — neither another
    process's outgoing connection nor another devnet's pick — while the run is trained, nor
    between a crashed node and its restart. The daemon still binds it: its listener and probe
    share a port with a bound socket that does not listen (both SO_REUSEADDR), and the node's
    own check for strangers looks only at listening sockets (node/listen_port.py). A port picked
    by binding and closing at once was free only at that moment: "cannot listen on
    127.0.0.1:PORT: Address already in use" was seen once, a devnet started right after another
    was killed.
    """

    def __init__(self, workdir: Path, run_dir: Path, redundancy: int, *, run_on_all: bool = False,
                 device: str = "auto") -> None:
        """``run_dir`` reaches the network through :meth:`publish`; ``run_on_all`` instead hands
        it to every daemon (``--run``, an operator's local copy), as devnets did before runs
        were published. ``device`` is every daemon's ``--device``."""
        self.workdir, self.run_dir, self.redundancy, self.run_on_all = workdir, run_dir, redundancy, run_on_all
        self.device = device
        self.procs: list[subprocess.Popen] = []
        self.dirs: list[Path] = []
        self.addrs: list[str] = []
        self.api_hosts: list[str] = []
        self.prefixes: list[tuple[str, ...]] = []  # what a node's command runs under (a network namespace)
        self.held: list[socket.socket] = []  # the listen ports reserved until stop()

    def plan(self, count: int, *, host: str = "127.0.0.1", api_host: str = "127.0.0.1",
             prefix: tuple[str, ...] = ()) -> list[str]:
        """Prepare ``count`` more nodes listening on ``host``; returns their multiaddrs."""
        for index in range(len(self.dirs), len(self.dirs) + count):
            data_dir = self.workdir / f"node-{index}"
            peer_id = init_data_dir(data_dir).peer_id
            self.dirs.append(data_dir)
            self.addrs.append(f"/ip4/{host}/tcp/{self._reserve_port(host)}/p2p/{peer_id}")
            self.api_hosts.append(api_host)
            self.prefixes.append(prefix)
        return self.addrs[-count:]

    def _reserve_port(self, host: str) -> int:
        if host != "127.0.0.1":  # an address in a network namespace (nat, partition): a port of its own there
            return _free_port()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, 0))
        self.held.append(sock)
        return sock.getsockname()[1]

    def peer_id(self, index: int) -> str:
        return self.addrs[index].rsplit("/", 1)[1]

    def start(self, index: int, *, audit: bool, bootstrap: list[str], extra_args: tuple[str, ...] = (),
              env: dict[str, str] | None = None) -> None:
        """Start (or restart) node ``index``. It trusts every node planned so far: one operator
        runs the whole devnet (docs/protocol.md §8.1)."""
        data_dir = self.dirs[index]
        host, port = self.addrs[index].split("/")[2], self.addrs[index].split("/")[4]
        # an adversary (``--behaviour`` in ``extra_args``) runs under the harness's own entry point;
        # an honest node is the product's daemon, unchanged
        program = ("open1b.devnet.daemon_entry",) if "--behaviour" in extra_args else ("open1b.node.cli", "daemon")
        cmd = [*self.prefixes[index], sys.executable, "-m", *program, "--data-dir", str(data_dir),
               "--listen", f"{host}:{port}", "--api", f"{self.api_hosts[index]}:0",
               "--redundancy", str(self.redundancy), "--device", self.device, "--log-prefix", f"node-{index} "]
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

    def token(self, index: int) -> str:
        """Node ``index``'s API token: its mutating routes need it, and every route off loopback
        (the partition scenario's APIs listen on a management link)."""
        return read_api_token(self.dirs[index])

    def publish(self, index: int, update: Callable[[dict], None] = lambda job: None) -> dict:
        """Publish the run directory through node ``index``'s API (what ``open1b-node publish``
        does); ``update`` sees the job at every poll."""
        return publish(self.api(index), self.run_dir, update, timeout=PUBLISH_STALL_S,
                       token=self.token(index))

    def kill(self, index: int) -> None:
        """``kill -9``: no shutdown path runs, as in a crash or power cut of the process."""
        self.procs[index].kill()
        self.procs[index].wait()

    def stop(self) -> None:
        for i, proc in enumerate(self.procs):
            if proc.poll() is None:
                try:
                    call(self.api(i), "/v1/shutdown", method="POST", timeout=2, token=self.token(i))
                except (ApiUnavailable, DevnetError):
                    proc.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for sock in self.held:
            sock.close()
        self.held.clear()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def say(line: str) -> None:
    """One line of a devnet's progress, on stderr (stdout carries the summary)."""
    print(f"devnet: {line}", file=sys.stderr, flush=True)
