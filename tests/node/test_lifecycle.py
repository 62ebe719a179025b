"""A daemon's life as an operator sees it (issue 15): ports it cannot share, a clean stop that
leaves nothing behind, SIGTERM logged, restart, and commands that create nothing they should not."""

from __future__ import annotations

import os
import signal
import socket
import subprocess

import pytest

from .commands import CLI, cli, wait_for

pytestmark = pytest.mark.integration


def _start(data_dir, *args, log=None):
    return subprocess.Popen([*CLI, "daemon", "--data-dir", str(data_dir), "--api", "127.0.0.1:0", *args],
                            stdout=subprocess.DEVNULL, stderr=open(log, "wb") if log else subprocess.DEVNULL)


def _port(addr_file) -> int:
    return int(addr_file.read_text().split("/tcp/")[1].split("/")[0])


def test_ports_are_exclusive_and_a_clean_stop_leaves_nothing(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    rc, _, err = cli("init", "--data-dir", str(first))
    assert rc == 0, err
    rc, _, err = cli("init", "--data-dir", str(second))
    assert rc == 0, err
    configs = [(d / "config.toml").read_text() for d in (first, second)]
    assert configs[0] != configs[1]  # init picks free ports: two nodes on one machine do not collide

    log = tmp_path / "first.log"
    proc = _start(first, "--listen", "127.0.0.1:0", "--log-file", str(log))
    try:
        wait_for(lambda: (first / "p2p.addr").exists(), 60, what="the first daemon")
        port = _port(first / "p2p.addr")
        # a second daemon on the same libp2p port is refused, in one line (before: both listened)
        rc, _, err = cli("daemon", "--data-dir", str(second), "--listen", f"127.0.0.1:{port}", "--api", "127.0.0.1:0",
                         timeout=60)
        assert rc == 1 and err.strip().count("\n") == 0 and "Address already in use" in err, err
        assert not (second / "daemon.lock").exists() and not (second / "api.addr").exists()
        # ... and its metrics on a port in use too
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            rc, _, err = cli("daemon", "--data-dir", str(second), "--listen", "127.0.0.1:0", "--api", "127.0.0.1:0",
                             "--metrics", f"127.0.0.1:{taken.getsockname()[1]}", timeout=60)
        assert rc == 1 and err.strip().count("\n") == 0 and "cannot serve metrics" in err, err
        # `status` pointed at the libp2p port: one line, not an HTTP traceback
        rc, _, err = cli("status", "--api", f"127.0.0.1:{port}")
        assert rc == 1 and "Traceback" not in err and err.startswith("open1b-node: error:"), err

        rc, out, err = cli("stop", "--data-dir", str(first))
        assert rc == 0 and f"pid {proc.pid}" in out, err
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert sorted(p.name for p in first.iterdir() if p.name.endswith((".addr", ".lock"))) == []
    text = log.read_text()
    assert "SIGTERM received: shutting down" in text and "stopped" in text
    rc, _, err = cli("stop", "--data-dir", str(first))
    assert rc == 1 and "no running daemon" in err


def test_restart_and_sigterm_from_outside(tmp_path):
    node = tmp_path / "node"
    rc, _, err = cli("init", "--data-dir", str(node))
    assert rc == 0, err
    rc, out, err = cli("restart", "--data-dir", str(node), "--json", timeout=90)  # nothing running: it starts one
    assert rc == 0, err
    pid = int(out.split('"started": ')[1].split(",")[0])
    try:
        rc, out, err = cli("restart", "--data-dir", str(node), timeout=90)
        assert rc == 0 and f"stopped pid {pid}" in out, err
        new_pid = int(out.split("started pid ")[1].split(",")[0])
        os.kill(new_pid, signal.SIGTERM)  # systemd's stop
        wait_for(lambda: not (node / "daemon.lock").exists(), 30, what="a clean stop")
        assert not (node / "api.addr").exists() and not (node / "p2p.addr").exists()
        assert "SIGTERM received: shutting down" in (node / "daemon.log").read_text()
    finally:
        for p in (pid, locals().get("new_pid")):
            if p:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def test_key_show_creates_nothing_and_a_loose_key_is_refused(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env_dir = tmp_path / "nowhere"
    proc = subprocess.run([*CLI, "key", "show"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "HOME": str(home), "OPEN1B_PATH": str(env_dir)})
    assert proc.returncode == 1 and "cannot read the node key" in proc.stderr
    assert not env_dir.exists() and not any(home.iterdir())
    node = tmp_path / "node"
    assert cli("init", "--data-dir", str(node))[0] == 0
    key = node / "keystore" / "identity.key"
    key.chmod(0o644)
    rc, _, err = cli("key", "show", "--data-dir", str(node))
    assert rc == 1 and "chmod 600" in err, err
    key.chmod(0o600)
    (node / "keystore").chmod(0o777)
    rc, _, err = cli("daemon", "--data-dir", str(node), "--listen", "127.0.0.1:0", "--api", "127.0.0.1:0")
    assert rc == 1 and "chmod 700" in err, err


def test_train_out_over_an_old_run_clears_its_files_and_refuses_other_directories(tmp_path):
    from open1b.deterministic.runfile import MANIFEST_FILE, checkpoint_path
    from open1b.node.cli import _fresh_run_dir
    from open1b.protocol import Open1bError

    old = tmp_path / "old-run"
    for k in range(5):
        checkpoint_path(old, k).parent.mkdir(parents=True, exist_ok=True)
        checkpoint_path(old, k).write_bytes(b"stale")
    (old / MANIFEST_FILE).write_bytes(b"old manifest")
    (old / "notes.txt").write_text("the operator's own file")
    assert _fresh_run_dir(old) == old
    assert not any(checkpoint_path(old, k).exists() for k in range(5)) and not (old / MANIFEST_FILE).exists()
    assert (old / "notes.txt").exists()  # only run files are removed
    other = tmp_path / "photos"
    other.mkdir()
    (other / "cat.jpg").write_bytes(b"x")
    with pytest.raises(Open1bError, match="holds no run"):
        _fresh_run_dir(other)
    assert (other / "cat.jpg").exists()


def test_the_replay_worker_dies_with_its_daemon():
    """kill -9 of the daemon: its worker ends too (before: it finished its replay for nobody and
    died of a BrokenPipeError). The worker's stdin is held open here, so only its watch on its
    parent can end it."""
    import sys

    read_end, write_end = os.pipe()
    spawn = ("import os, subprocess, sys, time; w = subprocess.Popen([sys.executable, '-m', 'open1b.node.worker',"
             " '--device', 'cpu', '--parent', str(os.getpid())], stdout=subprocess.DEVNULL,"
             " stderr=subprocess.DEVNULL); print(w.pid, flush=True); time.sleep(600)")
    daemon = subprocess.Popen([sys.executable, "-c", spawn], stdin=read_end, stdout=subprocess.PIPE, text=True)
    try:
        worker = int(daemon.stdout.readline())
        daemon.kill()
        daemon.wait(timeout=10)

        def gone() -> bool:
            try:
                with open(f"/proc/{worker}/status") as f:
                    return any(line.startswith("State:") and "Z" in line for line in f)
            except FileNotFoundError:
                return True

        wait_for(gone, 30, what="the orphaned worker to exit")
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_daemon_ended_by_a_failing_component_leaves_no_address_files(tmp_path):
    """A component's exception ends the daemon (as the spot checker's disk-full error once did);
    api.addr and p2p.addr must not outlive it, or `status` and `stop` talk to nothing."""
    import random

    import trio

    from open1b.node.clock import Clock
    from open1b.node.config import NodeConfig
    from open1b.node.daemon import open_daemon

    data_dir = tmp_path / "node"

    class Failing:
        def replayer(self, honest):
            return honest

        def tracer(self, honest):
            return honest

        async def run(self, daemon):
            assert (data_dir / "api.addr").exists() and (data_dir / "p2p.addr").exists()
            raise RuntimeError("a component failed")

    async def main():
        config = NodeConfig(data_dir=data_dir, listen="127.0.0.1:0", api="127.0.0.1:0", audit=False)
        with trio.fail_after(60):
            async with open_daemon(config, clock=Clock(), rng=random.Random(0), harness=Failing()):
                await trio.sleep_forever()

    with pytest.raises(BaseExceptionGroup) as failed:
        trio.run(main)
    assert failed.group_contains(RuntimeError, match="a component failed")
    assert not (data_dir / "api.addr").exists() and not (data_dir / "p2p.addr").exists()
