"""Checkpoints held in part, for a spot check (docs/run-format.md §10.2 and §6.6).

A spot check of step k reads all of checkpoint k's parameters (it recomputes one micro-batch) and
its two bias-correction powers; of checkpoint k's moments and of everything of checkpoint k+1 it
reads only the elements that the challenged gradient chunks cover (the update check, link 3). So a
verifier need not fetch two whole checkpoints (for ``gpt-1b``, 2 × 11 GB):

* :func:`spot_pieces` names the state-tree chunks (1 MiB, §3.2) of checkpoint k or k+1 that a
  check of some gradient chunks reads;
* a verifier fetches just those, each checked on arrival against the checkpoint's chunk table,
  which is itself checked against h_k (§6.6), and holds them as ``RUN/checkpoints/<k:08d>.part``
  (the checkpoint's layout with holes where nothing was fetched: a sparse file) beside
  ``<k:08d>.table`` (the chunk table);
* :func:`open_part` accepts such a pair only when its header is the run's model's and its table
  hashes, with h_k's other preimage fields, to the published h_k; every range read from it then
  has each of its chunks hashed and compared with the table (:class:`.checkpoint_stream.HeldChunks`):
  a hole or a changed byte is refused, never computed on.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from open1b.protocol.commitments import CHUNK_SIZE, state_hash_of_root
from open1b.protocol.hashing import DIGEST_SIZE

from .bounded_read import FileRefused, open_regular, read_bounded
from .checkpoint_stream import HeldChunks, Slot, max_checkpoint_bytes, parse_header, read_header, state_root_from
from .config import GPTConfig
from .errors import CheckpointMismatchError, RunFormatError
from .fingerprint import CHUNK_ELEMENTS
from .runfile import checkpoint_path

PART_SUFFIX, TABLE_SUFFIX = ".part", ".table"
BEFORE, AFTER = "before", "after"  # checkpoint k (the step's input) and k+1 (its output)


def part_paths(run_dir: Path, step: int) -> tuple[Path, Path]:
    """Where checkpoint ``step`` held in part lies in a run directory: its bytes and its chunk table."""
    path = checkpoint_path(run_dir, step)
    return path.with_suffix(PART_SUFFIX), path.with_suffix(TABLE_SUFFIX)


def spot_pieces(config: GPTConfig, chunks: tuple[int, ...], which: str) -> dict[str, tuple[int, ...]]:
    """Tensor name → the indices of its state-tree chunks that a spot check of gradient ``chunks``
    reads of checkpoint k (``which`` = :data:`BEFORE`: every parameter chunk and the moments'
    chunks under the gradient chunks) or k+1 (:data:`AFTER`: the parameters' and moments' chunks
    under the gradient chunks); both powers of either."""
    if which not in (BEFORE, AFTER):
        raise ValueError(f"which is {BEFORE!r} or {AFTER!r}, not {which!r}")
    covered: dict[str, set[int]] = {}
    offset = 0
    n_params = config.n_params()
    for name, shape in config.param_shapes().items():
        size = math.prod(shape)
        for c in chunks:
            lo, hi = c * CHUNK_ELEMENTS, min((c + 1) * CHUNK_ELEMENTS, n_params)
            a, b = max(lo, offset), min(hi, offset + size)
            if a < b:  # elements a-offset … b-offset of this parameter, in its 1 MiB chunks
                covered.setdefault(name, set()).update(range(4 * (a - offset) // CHUNK_SIZE,
                                                             (4 * (b - offset) - 1) // CHUNK_SIZE + 1))
        offset += size
    out: dict[str, tuple[int, ...]] = {}
    for name, shape in config.param_shapes().items():
        under = tuple(sorted(covered.get(name, ())))
        if which == BEFORE:
            out[f"param/{name}"] = tuple(range(max(1, -(-4 * math.prod(shape) // CHUNK_SIZE))))
        elif under:
            out[f"param/{name}"] = under
        if under:
            out[f"adam_m/{name}"] = out[f"adam_v/{name}"] = under
    out["adam/beta1_pow"] = out["adam/beta2_pow"] = (0,)  # 4 bytes each: every held state has its powers
    return out


@dataclass(frozen=True)
class PartState:
    """Checkpoint ``step`` held in part, checked against h_step: what :mod:`.fingerprint`'s spot
    links read of a :class:`.state.TrainState` — its parameters whole (``params``: the arrays when
    they were read, else a :class:`.checkpoint_stream.HeldChunks`), its moments by range."""

    config: GPTConfig
    step: int
    params: dict[str, np.ndarray] | HeldChunks
    m: HeldChunks
    v: HeldChunks
    beta1_pow: np.float32
    beta2_pow: np.float32


def open_part(run_dir: Path, step: int, config: GPTConfig, expected: bytes, link: tuple[bytes, int, bytes], *,
              params: bool) -> PartState:
    """Checkpoint ``step`` of the run in ``run_dir`` held in part (:func:`part_paths`), accepted
    only when its header is ``config``'s state at ``step`` and its chunk table hashes to
    ``expected`` (h_step) with ``link`` = (prev, lr bits, batch digest), the rest of h_step's
    preimage. ``params``: read every parameter now (each chunk checked), as checkpoint k's are
    needed; otherwise they are read by range, as the moments are. Raises
    :class:`CheckpointMismatchError` for a table that does not prove h_step or a chunk that is not
    held, :class:`RunFormatError` for files that are not such a pair."""
    path, table_path = part_paths(run_dir, step)
    try:
        fd, size = open_regular(path, max_checkpoint_bytes(config))
    except FileRefused as exc:
        raise RunFormatError(f"checkpoint {step} (held in part): {exc}") from None
    try:
        slots = parse_header(bytes(read_header(fd, size, step)), size, config, step)
    finally:
        os.close(fd)
    digests = _table_digests(table_path, slots, step)
    prev, lr, batch = link
    if state_hash_of_root(prev, step, lr, batch, *state_root_from(slots, digests)) != expected:
        raise CheckpointMismatchError(f"checkpoint {step}: its chunk table does not hash to the published h_{step}")
    groups = {prefix: HeldChunks(path, prefix, slots, digests) for prefix in ("param", "adam_m", "adam_v")}
    powers = HeldChunks(path, "adam", slots, digests)
    beta1_pow, beta2_pow = (np.float32(powers.elements(n, slice(0, 1))[0]) for n in ("beta1_pow", "beta2_pow"))
    held: dict[str, np.ndarray] | HeldChunks = groups["param"]
    if params:
        held = {n: groups["param"].elements(n, slice(0, math.prod(s))).reshape(s)
                for n, s in config.param_shapes().items()}  # fmt: skip
    return PartState(config, step, held, groups["adam_m"], groups["adam_v"], beta1_pow, beta2_pow)


def _table_digests(path: Path, slots: dict[str, Slot], step: int) -> dict[str, list[bytes]]:
    """The chunk table at ``path`` cut into each tensor's chunk digests (tensors in state-tree
    order, chunks in index order: docs/run-format.md §6.6), refused unless its size is exactly
    that of ``slots``' chunks (checked before it is read)."""
    order = sorted(slots, key=lambda n: n.encode())
    counts = [max(1, -(-slots[n].nbytes // CHUNK_SIZE)) for n in order]
    size = DIGEST_SIZE * sum(counts)
    try:
        table = read_bounded(path, size)
    except FileRefused as exc:
        raise RunFormatError(f"checkpoint {step}: chunk table: {exc}") from None
    if len(table) != size:
        raise RunFormatError(f"checkpoint {step}: a chunk table of {len(table)} bytes, not {size}")
    digests, at = {}, 0
    for name, count in zip(order, counts):
        digests[name] = [table[at + DIGEST_SIZE * i:at + DIGEST_SIZE * (i + 1)] for i in range(count)]
        at += DIGEST_SIZE * count
    return digests
