"""Drive the js-libp2p peer (js/peer.mjs) from Python, and install its npm dependencies.

The JS dependencies are pinned in js/package-lock.json and installed with ``npm ci`` into
js/node_modules (git-ignored) the first time, or whenever the lock file changes; npm's own cache
(~/.npm) makes a reinstall take seconds. Without Node.js the interop tests are skipped, saying
so; with Node.js, any failure to install is a test failure.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import queue
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

JS_DIR = Path(__file__).resolve().parent / "js"
STAMP = JS_DIR / "node_modules" / ".open1b-lock-sha256"
NPM_TIMEOUT_S = 300


def require_node() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.skip("Node.js is not installed: the js-libp2p interop tests need node >= 20 and npm")
    major = int(subprocess.run([node, "--version"], capture_output=True, text=True, check=True).stdout.lstrip("v").split(".")[0])
    assert major >= 20, f"node {major} is too old for js-libp2p 3 (need >= 20)"
    return node


def ensure_js_deps() -> None:
    """``npm ci`` unless node_modules already holds exactly what package-lock.json pins."""
    want = hashlib.sha256((JS_DIR / "package-lock.json").read_bytes()).hexdigest()
    if STAMP.exists() and STAMP.read_text() == want:
        return
    npm = shutil.which("npm")
    assert npm is not None, "Node.js is installed but npm is not: install npm to run the interop tests"
    proc = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=JS_DIR,
                          capture_output=True, text=True, timeout=NPM_TIMEOUT_S)
    assert proc.returncode == 0, f"npm ci failed:\n{proc.stdout}\n{proc.stderr}"
    STAMP.write_text(want)


class JsPeer:
    """One js-libp2p node in a child process. ``call`` sends a command and waits for its answer;
    gossip messages it receives accumulate in :attr:`messages`."""

    def __init__(self, seed: bytes, log_path: Path) -> None:
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [require_node(), "--import", "./shim.mjs", "peer.mjs", seed.hex()], cwd=JS_DIR, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
        )
        self._ids = itertools.count(1)
        self._answers: dict[int, queue.Queue] = {}
        self._lock = threading.Lock()
        self.messages: list[dict] = []
        self._ready: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        try:
            ready = self._ready.get(timeout=60)
        except queue.Empty:
            self.close()
            raise AssertionError(f"the js peer did not start; see {log_path}") from None
        self.peer_id: str = ready["peer_id"]
        self.addr: str = ready["addrs"][0]

    def _read(self) -> None:
        for line in self.proc.stdout:
            msg = json.loads(line)
            if msg.get("event") == "ready":
                self._ready.put(msg)
            elif msg.get("event") == "message":
                with self._lock:
                    self.messages.append(msg)
            elif "id" in msg:
                with self._lock:
                    box = self._answers.get(msg["id"])
                if box is not None:
                    box.put(msg)

    def call(self, cmd: str, timeout: float = 30, **args) -> dict:
        request_id = next(self._ids)
        box: queue.Queue = queue.Queue()
        with self._lock:
            self._answers[request_id] = box
        self.proc.stdin.write(json.dumps({"id": request_id, "cmd": cmd, **args}) + "\n")
        self.proc.stdin.flush()
        try:
            answer = box.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"js peer: no answer to {cmd} within {timeout} s") from None
        assert answer["ok"], f"js peer: {cmd} failed: {answer.get('error')}"
        return answer

    def received(self, topic: str) -> list[dict]:
        with self._lock:
            return [m for m in self.messages if m["topic"] == topic]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.call("stop", timeout=5)
                self.proc.wait(timeout=10)
            except (AssertionError, OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def wait_until(predicate, timeout: float, what: str, interval: float = 0.25):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(interval)
