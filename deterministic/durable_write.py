"""The one way files are replaced, here and in the node (``node/files.py`` re-exports it): a run
directory's checkpoints, samples and manifest, the draw index, a node's config and address files.

:func:`write_atomic` leaves the old content or the new, never a torn mix, and once it returns the
new content survives a power cut: the file is fsynced before the rename, and the directory after
it (a rename lives in the directory, and without that fsync it can be lost while the file's
bytes are not). Stdlib only, so that both the engine and the node can use it.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["write_atomic"]


def write_atomic(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data``: written to a temporary file beside it, fsynced, renamed over
    it, and the directory fsynced so that the rename itself survives a power cut. Creates the
    directory if needed; on any failure the temporary file is removed and ``path`` is untouched."""
    path = Path(path)
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
