"""A second, independent devnet as background load (:func:`background_devnet`): what a scenario
must survive on a shared machine (docs/reliability.md, "under load").

The load is a plain devnet auditing a long run, started again whenever it ends, for as long as the
context is open. It has its own working directory and ports (every devnet asks the kernel for free
ones), runs in a process group of its own, and on exit is stopped the way an operator stops it
(SIGINT: the devnet's own teardown stops its daemons, which remove their files) and then, if
anything of it is still alive after a bound, killed. Nothing is left behind: no process of the
group, no directory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

STOP_GRACE_S = 30.0  # the devnet's teardown: each daemon's shutdown (15 s bound) after SIGINT
POLL_S = 0.5


@dataclass
class Load:
    """What the background devnet did while the context was open."""

    started: int = 0  # devnets started (each a fresh run, trained and audited)
    finished: list[int] = field(default_factory=list)  # their exit codes, as each ended on its own
    pgids: list[int] = field(default_factory=list)  # the process group of each
    workdir: Path | None = None


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # the id was reused by another user's group: ours is gone
        return False
    return True


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGINT to the whole group (the devnet and its daemons shut down as on Ctrl-C), then SIGKILL
    to whatever is still alive after :data:`STOP_GRACE_S`."""
    pgid = proc.pid  # start_new_session: the group's id is its leader's pid
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGINT)
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline and (proc.poll() is None or group_alive(pgid)):
        time.sleep(POLL_S)
    if group_alive(pgid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    proc.wait()
    while group_alive(pgid):  # SIGKILL is not refused; the kernel reaps the children shortly
        time.sleep(0.05)


@contextlib.contextmanager
def background_devnet(*, steps: int = 64, nodes: int = 3, deadline_s: float = 3600.0) -> Iterator[Load]:
    """Run a plain devnet of ``nodes`` auditors over a ``steps``-step run in the background, over
    and over, until the context exits; yields a :class:`Load` that counts them. It runs at the
    caller's niceness, as the devnet it loads does: the two compete as equals."""
    load = Load(workdir=Path(tempfile.mkdtemp(prefix="open1b-load-")))
    stopping = threading.Event()
    current: list[subprocess.Popen] = []
    lock = threading.Lock()

    def loop() -> None:
        while not stopping.is_set():
            workdir = load.workdir / f"devnet-{load.started}"
            cmd = [sys.executable, "-m", "open1b.devnet", "--steps", str(steps), "--nodes", str(nodes),
                   "--deadline", str(deadline_s), "--workdir", str(workdir), "--json"]
            with lock:
                if stopping.is_set():
                    return
                with open(load.workdir / "devnet.log", "ab") as log:
                    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, stdin=subprocess.DEVNULL,
                                            start_new_session=True)
                current[:] = [proc]
                load.started += 1
                load.pgids.append(proc.pid)
            code = proc.wait()
            with lock:
                if stopping.is_set():
                    return
                load.finished.append(code)
            # each run's working directory goes once it has ended: a long sweep would fill the disk
            # with checkpoints otherwise
            shutil.rmtree(workdir, ignore_errors=True)
            if code not in (0, 2):
                time.sleep(5.0)  # a devnet that cannot start: do not spin

    thread = threading.Thread(target=loop, name="background-devnet", daemon=True)
    thread.start()
    try:
        yield load
    finally:
        with lock:
            stopping.set()
            procs = list(current)
        for proc in procs:
            _stop_group(proc)
        thread.join()
        shutil.rmtree(load.workdir, ignore_errors=True)


def leftovers(load: Load) -> list[str]:
    """What of the load is still on the machine after the context closed: processes whose command
    line names its working directory, and the directory itself (both must be none)."""
    found = []
    if load.workdir is not None and load.workdir.exists():
        found.append(str(load.workdir))
    for proc_dir in Path("/proc").iterdir():
        if not proc_dir.name.isdigit():
            continue
        try:
            cmdline = (proc_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if load.workdir is not None and str(load.workdir) in cmdline:
            found.append(f"pid {proc_dir.name}: {cmdline.strip()[:120]}")
    return found
