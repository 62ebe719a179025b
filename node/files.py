"""Files the node writes and reads on someone's behalf.

* :func:`write_atomic` (from ``open1b.deterministic.durable_write``, the one implementation the
  engine shares): a crash leaves the old content or the new, never a torn mix, and what it wrote
  survives a power cut (file and directory fsynced).
* :func:`read_bounded` / :func:`open_regular` (from ``open1b.deterministic.bounded_read``, which
  the engine's readers share): a file named by a caller (a run directory's manifest, a checkpoint
  to import, a config) is opened without following a final symlink the caller did not ask for,
  refused unless it is a regular file, size-checked with ``fstat`` before a byte is read, and read
  up to its limit only; :func:`read_bounded_async` reads off the event loop.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import trio

from open1b.deterministic.bounded_read import FileRefused, open_regular, read_bounded
from open1b.deterministic.durable_write import write_atomic
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


async def read_bounded_async(path: Path, limit: int, *, follow: bool = False) -> bytes:
    """:func:`read_bounded` in a worker thread, so a slow disk never stalls the event loop."""
    return await trio.to_thread.run_sync(lambda: read_bounded(path, limit, follow=follow))
