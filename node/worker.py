"""The replay worker: one replay in its own OS process, so the daemon's trio loop stays responsive
and a crash or hang in numeric code costs one replay, not the node.

Protocol with the daemon: ``python -m open1b.node.worker RUN_DIR STEP`` prints exactly one JSON
line on stdout — either a result or ``{"error": …}`` — and exits 0 or 1. The daemon does not
believe the worker's verdict: it compares the reported hashes with the manifest itself and
signs only what it has checked.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import trio

from open1b.protocol import Open1bError


class ReplayFailed(Open1bError):
    """The worker process could not replay the step (bad input, crash, timeout)."""


@dataclass(frozen=True)
class WorkerResult:
    pre_state: bytes
    post_state: bytes
    elapsed_ms: int


async def run_replay(run_dir: Path, step: int, *, timeout_s: float, env: dict[str, str] | None = None) -> WorkerResult:
    """Replay ``step`` in a worker process; raises :class:`ReplayFailed` (cancelling kills it)."""
    cmd = [sys.executable, "-m", "open1b.node.worker", str(run_dir), str(step)]
    try:
        with trio.fail_after(timeout_s):
            proc = await trio.run_process(cmd, capture_stdout=True, capture_stderr=True, check=False, env=env)
    except trio.TooSlowError as exc:
        raise ReplayFailed(f"replay of step {step} timed out after {timeout_s:.0f} s") from exc
    lines = proc.stdout.decode(errors="replace").strip().splitlines()
    try:
        reply = json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = proc.stderr.decode(errors="replace")[-500:]
        raise ReplayFailed(f"worker exited {proc.returncode} without a result: {tail}") from None
    if "error" in reply:
        raise ReplayFailed(reply["error"])
    return WorkerResult(bytes.fromhex(reply["pre_state"]), bytes.fromhex(reply["post_state"]), int(reply["elapsed_ms"]))


def main(argv: list[str]) -> int:
    try:
        from open1b.deterministic.replay import replay

        run_dir, step = Path(argv[0]), int(argv[1])
        result = replay(run_dir, step)
    except (Open1bError, ValueError, IndexError, OSError) as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        return 1
    print(json.dumps({
        "pre_state": result.pre_state.hex(),
        "post_state": result.post_state.hex(),
        "elapsed_ms": int(result.elapsed_s * 1000),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
