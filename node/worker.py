"""The replay worker: replays run in a separate, long-lived OS process, so the daemon's trio loop
stays responsive, numeric code is imported and compiled once, and a crash or hang costs one
replay (the process is killed and restarted), never the node.

A CPU replay parks gradient sums in an unnamed spill file (open1b.deterministic.spill) in
``--spill-dir`` (the daemon gives its data directory's ``spill``; default: the run's directory),
never in the system's temporary directory, often a tmpfs whose pages are memory.

The worker is where the device lives: it is started with ``--device auto|cpu|cuda[:N]``
(config ``device``), chooses and self-checks the device (:func:`open1b.deterministic.device.select_device`:
probes run by the device's own kernels and the known-answer step, whose hash must be the CPU's
pinned one), and falls back to the CPU when a GPU is missing or fails a check. Any CUDA context
is created in this process, never in the daemon's trio process.

Wire protocol (JSON lines over the worker's stdin/stdout): at start the worker writes one hello
line, ``{"device": class, "label": "cuda:0" | "cpu", "reason": text}`` (or ``{"error": text}``
and exits); then the daemon writes one request line and the worker answers one line, or
``{"error": text}``. Requests, one at a time (the daemon takes a turn for each, a dispute's first: :mod:`.turns`):

* ``{"run_dir": …, "step": k}``, a replay: ``{"pre_state": hex, "post_state": hex, "witness": hex,
  "elapsed_ms": n}``. The daemon does not believe the worker's verdict: it compares the hashes with
  the manifest itself and signs only what it has checked, with the device class of the hello.
* ``{"op": "answer", "run_dir": …, "step": k, "challenge": hex, "out": path}``: the trainer's
  answer to a spot-check challenge (docs/protocol.md §5.5), written to ``out``: ``{"size": n}``.
  Answers are megabytes (gradient chunks), so they travel as files, not on this pipe.
* ``{"op": "spot", "run_dir": …, "step": k, "challenge": hex, "slot_challenge": hex, "answer": path | null,
  "links": […], "recomputed": path}``: a spot check (docs/run-format.md §10.2) of the files in
  ``run_dir`` against the answer in ``answer`` (null: none came), of the halves in ``links``
  (``"micro"``, ``"answer"``; a ``"micro"``-only check that holds is ``passed``): ``{"passed": bool,
  "caught": link, "slot": s, "chunks": […], "chunks_total": n, "fingerprint": hex, "elapsed_ms": n}``.
  The micro half writes the secret slot's recomputed chunks to ``recomputed``; the answer half reads
  them there (kilobytes: a file, like the answer).
* ``{"op": "trace" | "op_data", "run_dir": …, "step": k, ["pos": p,] "out": path}``: a dispute's
  traced replay of step k, or op p's data, written to ``out`` (node/dispute_tracer.py): ``{"size": n}``.

Answering and checking run here, never in the daemon's trio process: both recompute part of a step.
"""

from __future__ import annotations

import argparse
import errno
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
from open1b.protocol.spotcheck import CAUGHT

from .turns import Turns

log = logging.getLogger(__name__)

# The halves of a spot check (check_spot's ``links``; the daemon does not import the engine).
SPOT_MICRO, SPOT_ANSWER = "micro", "answer"
MAX_REPLY_BYTES = 4096  # a reply line: hashes and numbers (answers travel as files)


class ReplayFailed(Open1bError):
    """The worker could not replay the step (bad input, crash, timeout)."""


class WorkerStorageFull(ReplayFailed):
    """A write for the request found the disk full: no fault of the step, nor a broken worker;
    the request may succeed once there is room."""


@dataclass(frozen=True)
class WorkerResult:
    pre_state: bytes
    post_state: bytes
    witness: bytes  # W_k of the replay; the daemon binds it to its key when it signs
    elapsed_ms: int
    device: str  # the class of the device that replayed (docs/protocol.md, the attestation's ``device``)


@dataclass(frozen=True)
class SpotOutcome:
    """What the worker's spot check found (docs/run-format.md §10.2), for the ``spotcheck`` statement."""

    passed: bool
    caught: str  # one of protocol.spotcheck.CAUGHT; "none" iff passed
    slot: int
    chunks: tuple[int, ...]
    chunks_total: int
    fingerprint: bytes  # F_k, the committed fingerprint the step was checked against
    elapsed_ms: int
    device: str  # the class of the device that recomputed the slot


class ReplayWorker:
    """A handle on the worker process, started on first use and restarted after a failure."""

    def __init__(self, device: str = "auto", spill_dir: Path | None = None) -> None:
        self.device_spec = device  # what the operator asked for (``--device``)
        self.spill_dir = spill_dir  # where a CPU replay's spill file lies (module doc)
        self.device: str | None = None  # the class of the running worker's device, from its hello
        self.device_reason = ""
        self._proc: trio.Process | None = None
        self._buffer = b""
        self._starting = trio.Lock()  # one process at a time, and its hello read before any request
        self._turns = Turns()  # one request at a time, a dispute's first, else in arrival order
        self.restarts = 0
        # Set once a start has ended, its hello read or not (WorkerReplayer.ready): whoever waits
        # for the device class waits for the start under way, and never makes a second one.
        self.start_ended = trio.Event()

    async def start(self, *, timeout_s: float) -> None:
        """Start the worker now rather than at the first replay, so that the node reports its
        device (chosen and self-checked in the worker) from the start. A failure is logged; the
        next replay tries again (a start of its own cut short leaves no process, _ensure_started;
        a timeout while another caller's start runs leaves that one alone)."""
        try:
            with trio.fail_after(timeout_s):
                await self._ensure_started()
        except (trio.TooSlowError, ReplayFailed, trio.BrokenResourceError, ValueError) as exc:
            log.warning("replay worker did not start: %s", exc or "timed out")

    async def _ensure_started(self) -> trio.Process:
        async with self._starting:
            try:
                return await self._start_locked()
            except BaseException:
                self.kill()  # a start cut short (timed out, cancelled, a bad hello) leaves no process behind
                raise
            finally:
                self.start_ended.set()

    async def _start_locked(self) -> trio.Process:
        if self._proc is None or self._proc.returncode is not None:
            spill = [] if self.spill_dir is None else ["--spill-dir", str(self.spill_dir)]
            self._proc = await trio.lowlevel.open_process(
                [sys.executable, "-m", "open1b.node.worker", "--device", self.device_spec, "--parent", str(os.getpid()),
                 *spill], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
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

    async def request(self, request: dict, *, timeout_s: float, what: str, urgent: bool = False) -> dict:
        """Send one request (module doc; a dispute's ``trace`` and ``op_data`` come from
        node/dispute_tracer.py, ``urgent``: before the other requests waiting, :mod:`.turns`) and
        read its reply line; :class:`ReplayFailed` on any failure. The wait for the turn is not
        timed; a timeout or cancellation once the request is under way kills the process (it may
        be mid-computation: a restart is the only way out), one while it waits for another
        caller's start of the process (the daemon's :meth:`start`) leaves that start alone."""
        ok, proc = False, None
        async with self._turns.turn(urgent=urgent):  # the auditor, the spot checker and the answer server share one process
            try:
                with trio.fail_after(timeout_s):
                    proc = await self._ensure_started()
                    assert proc.stdin is not None
                    await proc.stdin.send_all(json.dumps(request).encode() + b"\n")
                    reply = json.loads(await self._read_line(proc))
                ok = True
            except trio.TooSlowError as exc:
                raise ReplayFailed(f"{what} timed out after {timeout_s:.0f} s") from exc
            except (trio.BrokenResourceError, ValueError) as exc:
                raise ReplayFailed(f"worker failed: {exc}") from exc
            finally:
                if not ok and proc is not None:
                    self.kill()
        if type(reply) is not dict:
            raise ReplayFailed("malformed worker reply: not an object")
        if "error" in reply:
            raise (WorkerStorageFull if reply.get("errno") == errno.ENOSPC else ReplayFailed)(str(reply["error"]))
        return reply

    async def replay(self, run_dir: Path, step: int, *, timeout_s: float) -> WorkerResult:
        """Replay ``step``; raises :class:`ReplayFailed`."""
        reply = await self.request({"run_dir": str(run_dir), "step": step}, timeout_s=timeout_s,
                                    what=f"replay of step {step}")
        try:
            result = WorkerResult(bytes.fromhex(reply["pre_state"]), bytes.fromhex(reply["post_state"]),
                                  bytes.fromhex(reply["witness"]), int(reply["elapsed_ms"]), self.device)
        except (KeyError, TypeError, ValueError) as exc:
            raise ReplayFailed(f"malformed worker reply: {exc}") from exc
        if not len(result.pre_state) == len(result.post_state) == len(result.witness) == 32:
            raise ReplayFailed("malformed worker reply: hashes must be 32 bytes")
        return result

    async def answer(self, run_dir: Path, step: int, challenge: bytes, out: Path, *, timeout_s: float) -> int:
        """Write the trainer's answer to ``challenge`` of ``step`` to ``out``; its size."""
        reply = await self.request({"op": "answer", "run_dir": str(run_dir), "step": step,
                                     "challenge": challenge.hex(), "out": str(out)},
                                    timeout_s=timeout_s, what=f"answer for step {step}")
        size = reply.get("size")
        if type(size) is not int or size < 0:
            raise ReplayFailed("malformed worker reply: size")
        return size

    async def spot(self, run_dir: Path, step: int, challenges: tuple[bytes, bytes], answer: Path | None,
                   recomputed: Path, *, timeout_s: float,
                   links: tuple[str, ...] = (SPOT_MICRO, SPOT_ANSWER)) -> SpotOutcome:
        """Spot check ``step`` with the files in ``run_dir``, the verifier's ``challenges`` (the
        chunks' and the slot's signatures) and the answer in ``answer`` (None: none came);
        ``links``: which half of the check, or both (``check_spot``'s ``links``); ``recomputed``:
        where the micro half leaves the slot's chunks for the answer half."""
        reply = await self.request({"op": "spot", "run_dir": str(run_dir), "step": step,
                                     "challenge": challenges[0].hex(), "slot_challenge": challenges[1].hex(),
                                     "answer": None if answer is None else str(answer), "links": list(links),
                                     "recomputed": str(recomputed)},
                                    timeout_s=timeout_s, what=f"spot check of step {step}")
        try:
            outcome = SpotOutcome(reply["passed"], reply["caught"], reply["slot"], tuple(reply["chunks"]),
                                  reply["chunks_total"], bytes.fromhex(reply["fingerprint"]), reply["elapsed_ms"],
                                  self.device)
        except (KeyError, TypeError, ValueError) as exc:
            raise ReplayFailed(f"malformed worker reply: {exc}") from exc
        if (type(outcome.passed) is not bool or len(outcome.fingerprint) != 32 or outcome.caught not in CAUGHT or outcome.passed != (outcome.caught == "none")
                or not all(type(v) is int and v >= 0 for v in (outcome.slot, outcome.chunks_total, outcome.elapsed_ms,
                                                              *outcome.chunks))):
            raise ReplayFailed("malformed worker reply: spot check outcome")
        return outcome

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


def _serve(device_spec: str, spill_dir: Path | None = None) -> int:
    from open1b.deterministic.allocator import return_freed_arrays_promptly
    from open1b.deterministic.device import select_device_or_cpu

    # before any array: a long-lived worker would otherwise keep a replay's freed heap (.allocator)
    return_freed_arrays_promptly()

    try:
        choice = select_device_or_cpu(device_spec)
    except Open1bError as exc:  # a bad spec, or a CPU that fails the self-checks: nothing to replay on
        _send({"error": f"{type(exc).__name__}: {exc}"})
        return 1
    _send({"device": choice.device_class, "label": choice.label, "reason": choice.reason})
    for line in sys.stdin:
        try:
            request = json.loads(line)
            reply = _handle(request, choice, spill_dir)
        except (Open1bError, ValueError, KeyError, TypeError, OSError) as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
            if isinstance(exc, OSError):  # the daemon tells a full disk from a broken step by it
                reply["errno"] = exc.errno
        _send(reply)
    return 0


def _handle(request: dict, choice, spill_dir: Path | None = None) -> dict:
    from open1b.deterministic.replay import replay
    from open1b.deterministic.spot_run import answer_from_run, check_spot

    op, run_dir, step = request.get("op", "replay"), Path(request["run_dir"]), int(request["step"])
    if op == "replay":
        result = replay(run_dir, step, device=choice, spill_dir=spill_dir)
        return {"pre_state": result.pre_state.hex(), "post_state": result.post_state.hex(),
                "witness": result.witness.hex(), "elapsed_ms": int(result.elapsed_s * 1000)}
    if op in ("trace", "op_data"):
        from open1b.deterministic.dispute_replay import write_dispute_file

        return {"size": write_dispute_file(run_dir, step, Path(request["out"]),
                                           None if op == "trace" else int(request["pos"]))}
    challenge = bytes.fromhex(request["challenge"])
    if op == "answer":
        answer = answer_from_run(run_dir, step, challenge, device=choice)
        Path(request["out"]).write_bytes(answer)
        return {"size": len(answer)}
    if op == "spot":
        # the daemon wrote the file after bounding what it received (MAX_ANSWER_SIZE)
        answer = None if request["answer"] is None else Path(request["answer"]).read_bytes()
        links, mine = tuple(request["links"]), Path(request["recomputed"])
        result = check_spot(run_dir, step, challenge, bytes.fromhex(request["slot_challenge"]), answer, device=choice,
                            links=links, recomputed=None if SPOT_MICRO in links else mine.read_bytes())
        if SPOT_MICRO in links and SPOT_ANSWER not in links:
            mine.write_bytes(result.recomputed)
        return {"passed": result.passed, "caught": result.caught, "slot": result.slot,
                "chunks": list(result.chunks), "chunks_total": result.chunks_total,
                "fingerprint": result.fingerprint.hex(), "elapsed_ms": result.elapsed_ms}
    raise ValueError(f"unknown request {op!r}")


if __name__ == "__main__":
    cli = argparse.ArgumentParser(prog="python -m open1b.node.worker")
    cli.add_argument("--device", default="auto")
    cli.add_argument("--parent", type=int, default=os.getppid(), help="the daemon's pid (default: our parent)")
    cli.add_argument("--spill-dir", type=Path, help="where a replay's spill file lies (default: the run's directory)")
    options = cli.parse_args()
    _die_with_parent(options.parent)  # before the numeric stack is imported, which takes seconds
    if options.spill_dir is not None:
        options.spill_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    sys.exit(_serve(options.device, options.spill_dir))
