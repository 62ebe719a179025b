"""Reading a file someone else named, bounded: the run directories the engine reads (a trainer's,
a caller's, one a node assembled from peers' blobs) and the files the node reads on a caller's
behalf (node/files.py) go through :func:`read_bounded`.

The file is opened without following a final symlink unless the caller allows it, refused unless
it is a regular file, size-checked with ``fstat`` before a byte is read, and read up to its limit
only: a FIFO, a device or ``/dev/zero`` behind a name is refused at once instead of blocking or
filling memory. Errors name the path and what was refused, never the bytes (the caller may not be
able to read the file itself).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from open1b.protocol import Open1bError

__all__ = ["FileRefused", "open_regular", "read_bounded"]


class FileRefused(Open1bError):
    """A file named by a caller is missing, not a regular file, a symlink, or too large."""


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
    """The bytes of the regular file ``path``, at most ``limit`` of them (see :func:`open_regular`)."""
    fd, _ = open_regular(path, limit, follow=follow)
    try:
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)  # the file may have grown since fstat: never read past the limit
    finally:
        os.close(fd)
    if len(data) > limit:
        raise FileRefused(f"{path}: refused: grew past the {limit} bytes allowed while being read")
    return data
