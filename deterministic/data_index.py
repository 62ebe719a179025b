"""The draw index of a run: for every sample, every batch row that drew it (docs/run-format.md §8.6).

Answering "which rows drew this document?" from the draw rule alone costs one hash per row of
every step (0.6 s for 80,957 steps of 8 rows); the index pays that once per run and answers a
query with two array slices. It holds the global row positions p = k·(R·M·B) + (r·M + μ)·B + j
grouped by sample (CSR: ``offsets[i] … offsets[i + 1]`` are sample i's rows, ascending), so a
document's rows are one contiguous slice over its sample range.

File (``RUN/data-index.bin``, written atomically; it is this node's own cache, but it is still
checked against the run before use and rebuilt on any difference), little-endian::

    0   8   magic b"OPEN1BDX"
    8   2   u16 version = 1
    10  6   reserved, 0
    16  32  run id (the manifest digest)
    48  8   u64 seed
    56  8   u64 steps S
    64  12  u32 R, M, B
    76  4   reserved, 0
    80  8   u64 N
    88  8·(N+1)  u64 offsets
    …   4·S·R·M·B  u32 row positions (a run has fewer than 2^32 rows)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from open1b.protocol.data_order import Draw, all_indices

from .errors import RunFormatError
from .durable_write import write_atomic

INDEX_FILE = "data-index.bin"
_MAGIC, _VERSION = b"OPEN1BDX", 1
_HEADER = struct.Struct("<8sH6s32sQQIIIIQ")


@dataclass(frozen=True, eq=False)
class DrawIndex:
    """Which rows drew each sample of one run (module doc)."""

    run: bytes
    seed: int
    steps: int
    topology: tuple[int, int, int]  # R, M, B
    samples: int
    offsets: np.ndarray  # u64 (N + 1,)
    positions: np.ndarray  # u32 (S·R·M·B,)

    @classmethod
    def build(cls, run: bytes, seed: int, steps: int, topology: tuple[int, int, int], samples: int) -> DrawIndex:
        rows = steps * topology[0] * topology[1] * topology[2]
        if rows >= 1 << 32:
            raise RunFormatError(f"a run of {rows} rows is too large for the draw index")
        drawn = np.fromiter(all_indices(seed, range(steps), *topology, samples), np.uint64, rows)
        positions = np.argsort(drawn, kind="stable").astype(np.uint32)  # by sample, rows ascending within
        offsets = np.zeros(samples + 1, np.uint64)
        np.cumsum(np.bincount(drawn.astype(np.int64), minlength=samples), out=offsets[1:])
        return cls(run, seed, steps, topology, samples, offsets, positions)

    def draws(self, first: int, stop: int) -> list[Draw]:
        """Every draw of samples [first, stop), in (step, rank, micro-batch, row) order."""
        if stop <= first:
            return []
        lo, hi = int(self.offsets[first]), int(self.offsets[stop])
        # the sample of each row in the slice: i repeated over its offsets[i] … offsets[i + 1]
        sample = np.repeat(np.arange(first, stop), np.diff(self.offsets[first:stop + 1].astype(np.int64)))
        order = np.argsort(self.positions[lo:hi], kind="stable")
        r, m, b = self.topology
        out = []
        for p, i in zip(self.positions[lo:hi][order].tolist(), sample[order].tolist()):
            k, rest = divmod(p, r * m * b)
            rank, rest = divmod(rest, m * b)
            out.append(Draw(k, rank, *divmod(rest, b), i))
        return out

    # -- the file --------------------------------------------------------------------------------
    def encode(self) -> bytes:
        header = _HEADER.pack(_MAGIC, _VERSION, bytes(6), self.run, self.seed, self.steps, *self.topology, 0,
                              self.samples)
        return header + self.offsets.astype("<u8").tobytes() + self.positions.astype("<u4").tobytes()

    @classmethod
    def decode(cls, data: bytes, *, run: bytes, seed: int, steps: int, topology: tuple[int, int, int],
               samples: int) -> DrawIndex:
        """The index in ``data`` if it is exactly the one of this run; :class:`RunFormatError` otherwise."""
        rows = steps * topology[0] * topology[1] * topology[2]
        if len(data) != _HEADER.size + 8 * (samples + 1) + 4 * rows:
            raise RunFormatError("draw index: wrong size for this run")
        magic, version, _, got_run, got_seed, got_steps, r, m, b, _, n = _HEADER.unpack_from(data)
        if (magic, version, got_run, got_seed, got_steps, (r, m, b), n) != (
                _MAGIC, _VERSION, run, seed, steps, topology, samples):
            raise RunFormatError("draw index: not this run's")
        offsets = np.frombuffer(data, "<u8", samples + 1, _HEADER.size)
        positions = np.frombuffer(data, "<u4", rows, _HEADER.size + 8 * (samples + 1))
        if offsets[0] != 0 or offsets[-1] != rows or np.any(np.diff(offsets.astype(np.int64)) < 0):
            raise RunFormatError("draw index: offsets out of order")
        return cls(run, seed, steps, topology, samples, offsets, positions)


def load_or_build(run_dir: Path, run: bytes, seed: int, steps: int, topology: tuple[int, int, int],
                  samples: int) -> DrawIndex:
    """The run's index from ``RUN/data-index.bin``, built and written there first if it is
    missing or not this run's (a read-only run directory gets an index in memory only)."""
    path = Path(run_dir) / INDEX_FILE
    key = dict(run=run, seed=seed, steps=steps, topology=topology, samples=samples)
    try:
        return DrawIndex.decode(path.read_bytes(), **key)
    except (OSError, RunFormatError):
        pass
    index = DrawIndex.build(**key)
    try:
        write_atomic(path, index.encode())
    except OSError:
        pass  # a cache, not a result: answering without it is only slower next time
    return index
