"""Arrays parked on disk while a step does not need them: the partial gradient sums of a replay's
earlier ranks (:func:`.step.step_gradients`), which wait for the last rank's backward.

A replay of a W-rank step needs the parameters whole through every rank's forward and backward,
and the sum of the ranks' gradients (as large again) from the end of rank 0's backward. Parked
here between ranks, the sum costs disk (the page cache, which the kernel may drop) instead of the
process's memory; each gradient comes back when the last rank's backward adds to it. The bytes
read back are the bytes written, so nothing about the sum changes.

The file lies in a directory the caller names, beside the data it works on (a replay's run
directory, a trainer's output directory, a node's data directory), never the system's temporary
directory by default: that is often a tmpfs, whose pages are the memory the file is there to
save. It has no name there (``O_TMPFILE``, or unlinked as it is created), so it is gone however
the process ends, an error or a kill included: there is nothing to clean up.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

import numpy as np


@dataclass(eq=False)
class Spilled:
    """One array in a :class:`SpillFile`, read back once (:meth:`take`)."""

    file: SpillFile
    offset: int
    shape: tuple[int, ...]
    dtype: np.dtype
    taken: bool = False

    def take(self) -> np.ndarray:
        """The array, as it was put; its place in the file is reused afterwards."""
        return self.file.take(self)


class SpillFile:
    """An unnamed temporary file in ``directory`` (module doc) that holds arrays until they are
    taken back. A taken array's place is reused by the next array of its size, so the file stays
    as large as what is parked at once."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self._file = tempfile.TemporaryFile(dir=os.fspath(directory))
        self._fd = self._file.fileno()
        self._end = 0
        self._free: dict[int, list[int]] = {}  # byte size -> offsets of taken arrays of that size

    def put(self, array: np.ndarray) -> Spilled:
        data = memoryview(np.ascontiguousarray(array)).cast("B")
        places = self._free.get(data.nbytes)
        if places:
            offset = places.pop()
        else:
            offset, self._end = self._end, self._end + data.nbytes
        at = offset
        while data.nbytes:
            n = os.pwrite(self._fd, data, at)
            data, at = data[n:], at + n
        return Spilled(self, offset, tuple(array.shape), array.dtype)

    def take(self, spilled: Spilled) -> np.ndarray:
        if spilled.file is not self or spilled.taken:
            raise ValueError("not an array of this file, or taken already")
        out = np.empty(spilled.shape, spilled.dtype)
        view, at = memoryview(out.reshape(-1)).cast("B"), spilled.offset
        nbytes = view.nbytes
        while view.nbytes:
            n = os.preadv(self._fd, [view], at)
            if n == 0:
                raise OSError(f"spill file ended at {at}, inside an array it holds")
            view, at = view[n:], at + n
        spilled.taken = True
        self._free.setdefault(nbytes, []).append(spilled.offset)
        return out

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> SpillFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def held(value):
    """``value``, taken back from its spill file if it was parked there."""
    return value.take() if isinstance(value, Spilled) else value
