"""The replay worker: replays run in a separate, long-lived OS process, so the daemon's trio loop
stays responsive, numeric code is imported and compiled once, and a crash or hang costs one
replay (the process is killed and restarted), never the node.

Wire protocol (JSON lines over the worker's stdin/stdout): the daemon writes
``{"run_dir": …, "step": k}``; the worker answers one line, either
``{"pre_state": hex, "post_state": hex, "elapsed_ms": n}`` or ``{"error": text}``. The daemon
does not believe the worker's verdict: it compares the hashes with the manifest itself and
signs only what it has checked.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import trio

from open1b.protocol import Open1bError

MAX_REPLY_BYTES = 4096
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


class ReplayFailed(Open1bError):
    """The worker could not replay the step (bad input, crash, timeout)."""


@dataclass(frozen=True)
class WorkerResult:
    pre_state: bytes
    post_state: bytes
    witness: bytes  # W_k of the replay; the daemon binds it to its key when it signs
    elapsed_ms: int


class ReplayWorker:
    """A handle on the worker process, started on first use and restarted after a failure."""

    def __init__(self) -> None:
        self._proc: trio.Process | None = None
        self._buffer = b""
        self.restarts = 0

    async def _ensure_started(self) -> trio.Process:
        if self._proc is None or self._proc.returncode is not None:
            self._proc = await trio.lowlevel.open_process(
                [sys.executable, "-m", "open1b.node.worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            self._buffer = b""
            self.restarts += 1
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
                                  bytes.fromhex(reply["witness"]), int(reply["elapsed_ms"]))
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


def _die_with_parent() -> None:
    """Have the kernel kill this process when the daemon that started it dies (even by
    ``kill -9``): an orphaned worker would finish its replay for nobody (Linux PR_SET_PDEATHSIG)."""
    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the broken pipe below still ends it
        pass
    if os.getppid() != parent:  # the daemon died before the request took effect
        sys.exit(0)


def _serve() -> int:
    from open1b.deterministic.replay import replay
    from open1b.deterministic.selfcheck import require_deterministic_machine

    _die_with_parent()
    require_deterministic_machine()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            result = replay(Path(request["run_dir"]), int(request["step"]))
            reply = {"pre_state": result.pre_state.hex(), "post_state": result.post_state.hex(),
                     "witness": result.witness.hex(), "elapsed_ms": int(result.elapsed_s * 1000)}
        except (Open1bError, ValueError, KeyError, TypeError, OSError) as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        try:
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()
        except BrokenPipeError:  # the daemon is gone: nobody to answer
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(_serve())
