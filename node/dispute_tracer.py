"""A disputing party's traced replays, computed in the worker process (docs/protocol.md §18.5):
the op trace of step k from checkpoint k and the committed samples, and the data of one op of it.

Both are full replays of the step (``deterministic/dispute_replay.py``), so they run where replays
run — the worker (:mod:`.worker`, requests ``trace`` and ``op_data``), one request at a time,
never in the daemon's trio process. Their results are megabytes (an op's inputs and outputs), so
they travel as files of canonical CBOR, which the daemon reads back bounded:

* ``trace``: ``{"records": [op record…], "pre_state": h_k, "post_state": the h_{k+1} reached}``
  (the tree and the signed commitment are the daemon's: it builds the tree from the records);
* ``op_data``: ``{"inputs": [[bytes, tensor proof | null]…], "outputs": [bytes…]}``

(written by :func:`open1b.deterministic.dispute_replay.write_dispute_file`).

:class:`Tracer` is the hook between the dispute agent and what traces: :class:`WorkerTracer`, or
what a devnet harness puts in its place (a forger's trace).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import cbor2
import trio

from open1b.protocol import RunManifest

from .files import FileRefused, read_bounded
from .op_data import OpData, OpFiles
from .worker import ReplayFailed, ReplayWorker

MAX_TRACE_FILE = 64 << 20  # a step's op records (`gpt-1b`: ~10⁵ records of at most 16 KiB)


@dataclass(frozen=True)
class StepTrace:
    """A party's trace of one step: its op records, and the states it started from and reached."""

    records: list[dict]
    pre_state: bytes
    post_state: bytes


class Tracer(Protocol):
    async def trace(self, manifest: RunManifest, run_dir: Path, step: int) -> StepTrace:
        """Step ``step`` replayed from checkpoint ``step`` in ``run_dir``, traced; :class:`ReplayFailed`."""

    async def op_data(self, manifest: RunManifest, run_dir: Path, step: int, pos: int) -> OpData:
        """Op ``pos``'s input bytes (state inputs with their tensor proofs) and output bytes, until
        the caller closes it."""


class WorkerTracer:
    """Traces in the worker process, bounded by the replay deadline, each before the worker's
    other requests waiting (a dispute's deadline runs meanwhile, §18.5)."""

    def __init__(self, worker: ReplayWorker, scratch: Path, timeout_s: float, op_files: OpFiles) -> None:
        self.worker, self.scratch, self.timeout_s, self.op_files = worker, scratch, timeout_s, op_files

    async def _file(self, request: dict, limit: int) -> dict:
        self.scratch.mkdir(parents=True, exist_ok=True)
        fd, out = tempfile.mkstemp(dir=self.scratch, suffix=".cbor")
        os.close(fd)
        try:
            await self.worker.request({**request, "out": out}, timeout_s=self.timeout_s, urgent=True,
                                      what=f"{request['op']} of step {request['step']}")
            decoded = await trio.to_thread.run_sync(lambda: cbor2.loads(read_bounded(Path(out), limit)))
        except (FileRefused, cbor2.CBORDecodeError, ValueError) as exc:
            raise ReplayFailed(f"the worker's {request['op']} file: {exc}") from exc
        finally:
            Path(out).unlink(missing_ok=True)
        if type(decoded) is not dict:
            raise ReplayFailed(f"the worker's {request['op']} file is not a map")
        return decoded

    async def trace(self, manifest: RunManifest, run_dir: Path, step: int) -> StepTrace:
        got = await self._file({"op": "trace", "run_dir": str(run_dir), "step": step}, MAX_TRACE_FILE)
        try:
            return StepTrace(list(got["records"]), bytes(got["pre_state"]), bytes(got["post_state"]))
        except (KeyError, TypeError) as exc:
            raise ReplayFailed(f"malformed trace file: {exc}") from exc

    async def op_data(self, manifest: RunManifest, run_dir: Path, step: int, pos: int) -> OpData:
        async def request(out: str) -> None:
            await self.worker.request({"op": "op_data", "run_dir": str(run_dir), "step": step, "pos": pos, "out": out},
                                      timeout_s=self.timeout_s, urgent=True, what=f"op_data of step {step}")

        return await self.op_files.write(request)


