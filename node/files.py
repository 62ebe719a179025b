"""Files the node writes and reads on someone's behalf.

* :func:`write_atomic`: a crash leaves the old content or the new, never a torn mix.
* :func:`read_bounded` / :func:`open_regular` (from ``open1b.deterministic.bounded_read``, which
  the engine's readers share): a file named by a caller (a run directory's manifest, a checkpoint
  to import, a config) is opened without following a final symlink the caller did not ask for,
  refused unless it is a regular file, size-checked with ``fstat`` before a byte is read, and read
  up to its limit only; :func:`read_bounded_async` reads off the event loop.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import trio

from open1b.deterministic.bounded_read import FileRefused, open_regular, read_bounded
from open1b.protocol import Open1bError

__all__ = ["FileRefused", "StorageFull", "check_free", "open_regular", "read_bounded", "read_bounded_async",
           "write_atomic"]


class StorageFull(Open1bError):
    """The data dir's filesystem has no room (left) for what was asked: the operator's problem to
    fix, never a peer's fault. Nothing partial is left behind."""


def check_free(directory: Path, need: int, reserve: int) -> None:
    """Raise :class:`StorageFull` unless ``need`` bytes fit in ``directory``'s filesystem with
    ``reserve`` bytes to spare."""
    free = shutil.disk_usage(directory).free
    if need + reserve > free:
        raise StorageFull(f"{directory}: {need} bytes needed plus a reserve of {reserve}, "
                          f"but only {free} bytes are free")


def write_atomic(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data``: written to a temporary file beside it, fsynced, renamed over
    it, and the directory fsynced so that the rename itself survives a power cut. Creates the
    directory if needed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


async def read_bounded_async(path: Path, limit: int, *, follow: bool = False) -> bytes:
    """:func:`read_bounded` in a worker thread, so a slow disk never stalls the event loop."""
    return await trio.to_thread.run_sync(lambda: read_bounded(path, limit, follow=follow))
