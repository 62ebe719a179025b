"""Files the node writes and reads on someone's behalf.

* :func:`write_atomic`: a crash leaves the old content or the new, never a torn mix.
* :func:`read_bounded` / :func:`open_regular`: a file named by a caller (a run directory's
  manifest, a checkpoint to import, a config) is opened without following a final symlink the
  caller did not ask for, refused unless it is a regular file, size-checked with ``fstat`` before a
  byte is read, and read up to its limit only. A FIFO, a device or ``/dev/zero`` behind a symlink
  is refused at once instead of blocking the event loop or filling memory. Errors name the path
  and what was refused, never the bytes (the caller may not be able to read the file itself).
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from pathlib import Path

import trio

from open1b.protocol import Open1bError


class FileRefused(Open1bError):
    """A file named by a caller is missing, not a regular file, a symlink, or too large."""


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


def open_regular(path: Path, limit: int, *, follow: bool = False) -> tuple[int, int]:
    """Open ``path`` for reading and return ``(fd, size)``, or raise :class:`FileRefused`.

    ``O_NONBLOCK`` makes opening a FIFO return at once (it is then refused by ``fstat``);
    ``O_NOFOLLOW`` (unless ``follow``) refuses a symlink in the last component. The caller owns
    the descriptor."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise FileRefused(f"{path}: refused: a symbolic link (name the file itself)") from None
        raise FileRefused(f"{path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused(f"{path}: refused: not a regular file")
        if st.st_size > limit:
            raise FileRefused(f"{path}: refused: {st.st_size} bytes, more than the {limit} allowed")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def read_bounded(path: Path, limit: int, *, follow: bool = False) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them (see :func:`open_regular`).
    Blocking: from async code use :func:`read_bounded_async`."""
    fd, _ = open_regular(path, limit, follow=follow)
    try:
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)  # the file may have grown since fstat: never read past the limit
    finally:
        os.close(fd)
    if len(data) > limit:
        raise FileRefused(f"{path}: refused: grew past the {limit} bytes allowed while being read")
    return data


async def read_bounded_async(path: Path, limit: int, *, follow: bool = False) -> bytes:
    """:func:`read_bounded` in a worker thread, so a slow disk never stalls the event loop."""
    return await trio.to_thread.run_sync(lambda: read_bounded(path, limit, follow=follow))
