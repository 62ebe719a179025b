"""The replay worker: replays run in a separate, long-lived OS process, so the daemon's trio loop
stays responsive, numeric code is imported and compiled once, and a crash or hang costs one
replay (the process is killed and restarted), never the node.

The worker is where the device lives: it is started with ``--device auto|cpu|cuda[:N]``
(config ``device``), chooses and self-checks the device (:func:`open1b.deterministic.device.select_device`:
probes run by the device's own kernels and the known-answer step, whose hash must be the CPU's
pinned one), and falls back to the CPU when a GPU is missing or fails a check. Any CUDA context
is created in this process, never in the daemon's trio process.

Wire protocol (JSON lines over the worker's stdin/stdout): at start the worker writes one hello
line, ``{"device": class, "label": "cuda:0" | "cpu", "reason": text}`` (or ``{"error": text}``
and exits); then the daemon writes ``{"run_dir": …, "step": k}`` and the worker answers one line,
either ``{"pre_state": hex, "post_state": hex, "witness": hex, "elapsed_ms": n}`` or
``{"error": text}``. The daemon does not believe the worker's verdict: it compares the hashes with
the manifest itself and signs only what it has checked, with the device class of the hello.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import trio

from open1b.protocol import DEVICE_CLASS, Open1bError

log = logging.getLogger(__name__)

MAX_REPLY_BYTES = 4096


class ReplayFailed(Open1bError):
    """The worker could not replay the step (bad input, crash, timeout)."""


@dataclass(frozen=True)
class WorkerResult:
    pre_state: bytes
    post_state: bytes
    witness: bytes  # W_k of the replay; the daemon binds it to its key when it signs
    elapsed_ms: int
    device: str  # the class of the device that replayed (docs/protocol.md, the attestation's ``device``)


class ReplayWorker:
    """A handle on the worker process, started on first use and restarted after a failure."""

    def __init__(self, device: str = "auto") -> None:
        self.device_spec = device  # what the operator asked for (``--device``)
        self.device: str | None = None  # the class of the running worker's device, from its hello
        self.device_reason = ""
        self._proc: trio.Process | None = None
        self._buffer = b""
        self._starting = trio.Lock()  # one process at a time, and its hello read before any request
        self.restarts = 0

    async def start(self, *, timeout_s: float) -> None:
        """Start the worker now rather than at the first replay, so that the node reports its
        device (chosen and self-checked in the worker) from the start. A failure is logged; the
        next replay tries again."""
        try:
            with trio.fail_after(timeout_s):
                await self._ensure_started()
        except (trio.TooSlowError, ReplayFailed, trio.BrokenResourceError, ValueError) as exc:
            log.warning("replay worker did not start: %s", exc or "timed out")
            self.kill()

    async def _ensure_started(self) -> trio.Process:
        async with self._starting:
            return await self._start_locked()

    async def _start_locked(self) -> trio.Process:
        if self._proc is None or self._proc.returncode is not None:
            self._proc = await trio.lowlevel.open_process(
                [sys.executable, "-m", "open1b.node.worker", "--device", self.device_spec, "--parent", str(os.getpid())],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            self._buffer = b""
            self.restarts += 1
            hello = json.loads(await self._read_line(self._proc))
            if type(hello) is not dict or "error" in hello:
                raise ReplayFailed(f"worker could not start: {hello.get('error') if type(hello) is dict else hello!r}")
            device = hello.get("device")
            if type(device) is not str or not DEVICE_CLASS.fullmatch(device):
                raise ReplayFailed(f"malformed worker hello: device {device!r}")
            self.device, self.device_reason = device, str(hello.get("reason", ""))[:300]
            log.info("replay worker on %s (%s)", device, self.device_reason)
        return self._proc

    async def _read_line(self, proc: trio.Process) -> bytes:
        assert proc.stdout is not None
        while b"\n" not in self._buffer:
            chunk = await proc.stdout.receive_some(4096)
            if not chunk:
                raise ReplayFailed(f"worker exited (code {proc.poll()}) without answering")
            self._buffer += chunk
            if len(self._buffer) > MAX_REPLY_BYTES:
                raise ReplayFailed("worker reply too long")
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def kill(self) -> None:
        if self._proc is not None and self._proc.returncode is None:
            self._proc.kill()
        self._proc = None

    async def replay(self, run_dir: Path, step: int, *, timeout_s: float) -> WorkerResult:
        """Replay ``step``; raises :class:`ReplayFailed`. Timeout or cancellation kills the process."""
        ok = False
        try:
            with trio.fail_after(timeout_s):
                proc = await self._ensure_started()
                assert proc.stdin is not None
                await proc.stdin.send_all(json.dumps({"run_dir": str(run_dir), "step": step}).encode() + b"\n")
                reply = json.loads(await self._read_line(proc))
            ok = True
        except trio.TooSlowError as exc:
            raise ReplayFailed(f"replay of step {step} timed out after {timeout_s:.0f} s") from exc
        except (trio.BrokenResourceError, ValueError) as exc:
            raise ReplayFailed(f"worker failed: {exc}") from exc
        finally:
            if not ok:
                self.kill()
        if "error" in reply:
            raise ReplayFailed(reply["error"])
        try:
            result = WorkerResult(bytes.fromhex(reply["pre_state"]), bytes.fromhex(reply["post_state"]),
                                  bytes.fromhex(reply["witness"]), int(reply["elapsed_ms"]), self.device)
        except (KeyError, TypeError, ValueError) as exc:
            raise ReplayFailed(f"malformed worker reply: {exc}") from exc
        if not len(result.pre_state) == len(result.post_state) == len(result.witness) == 32:
            raise ReplayFailed("malformed worker reply: hashes must be 32 bytes")
        return result

    async def aclose(self) -> None:
        if self._proc is not None and self._proc.returncode is None:
            assert self._proc.stdin is not None
            await self._proc.stdin.aclose()  # EOF: the worker exits by itself
            with trio.move_on_after(5):
                await self._proc.wait()
        self.kill()


def _die_with_parent(parent: int, poll_s: float = 1.0) -> None:
    """End this process within ``poll_s`` of the daemon ``parent`` dying (even by ``kill -9``): an
    orphaned worker would finish its replay for nobody. A watcher thread, not PR_SET_PDEATHSIG:
    that signal fires when the *thread* that spawned us exits, and the daemon may spawn from a
    worker thread that trio retires when idle. The daemon names itself, so a worker whose daemon
    died before this ran notices too."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _send(reply: dict) -> None:
    """One reply line; a daemon that is gone ends the worker quietly (no BrokenPipeError trace)."""
    try:
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        os._exit(0)


def _serve(device_spec: str) -> int:
    from open1b.deterministic.device import select_device_or_cpu
    from open1b.deterministic.replay import replay

    try:
        choice = select_device_or_cpu(device_spec)
    except Open1bError as exc:  # a bad spec, or a CPU that fails the self-checks: nothing to replay on
        _send({"error": f"{type(exc).__name__}: {exc}"})
        return 1
    _send({"device": choice.device_class, "label": choice.label, "reason": choice.reason})
    for line in sys.stdin:
        try:
            request = json.loads(line)
            result = replay(Path(request["run_dir"]), int(request["step"]), device=choice)
            reply = {"pre_state": result.pre_state.hex(), "post_state": result.post_state.hex(),
                     "witness": result.witness.hex(), "elapsed_ms": int(result.elapsed_s * 1000)}
        except (Open1bError, ValueError, KeyError, TypeError, OSError) as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        _send(reply)
    return 0


if __name__ == "__main__":
    cli = argparse.ArgumentParser(prog="python -m open1b.node.worker")
    cli.add_argument("--device", default="auto")
    cli.add_argument("--parent", type=int, default=os.getppid(), help="the daemon's pid (default: our parent)")
    options = cli.parse_args()
    _die_with_parent(options.parent)  # before the numeric stack is imported, which takes seconds
    sys.exit(_serve(options.device))
