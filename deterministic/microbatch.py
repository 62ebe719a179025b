"""A step's batch as the kernels consume it, packed for one upload.

For each micro-batch of a step's batch (``(ranks, micro_batches, b, T + 1)`` int32 tokens) the
kernels need four int32 vectors: the inputs ``tokens[:, :-1]`` and targets ``tokens[:, 1:]``
flattened, and the embedding backward's counting sort of the inputs (``order``, ``starts``:
:func:`.embedding.positions_by_token`). :func:`pack_batch` lays all of them, for every
micro-batch, into one int32 array, so a device backend uploads a step's batch in one transfer
and never returns to the host for it; :func:`micro_batches` slices any array with that layout
(host or device) into :class:`MicroBatch` views. The sort is integer work on the host, done
while packing (it has no floating point, so where it runs changes no bit).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .embedding import positions_by_token

FIELDS = ("inputs", "targets", "order", "starts")


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch's int32 vectors (host or backend arrays); ``rows`` = b·T."""

    inputs: object
    targets: object
    order: object
    starts: object
    rows: int


Layout = list[list[list[tuple[int, int]]]]
"""``layout[rank][mb][field]`` = (offset, length) in the packed array, fields in :data:`FIELDS` order."""


def pack_batch(batch: np.ndarray, vocab_size: int) -> tuple[np.ndarray, Layout]:
    """Every micro-batch of ``batch`` (ranks, micro_batches, b, T + 1) as one int32 array and its layout."""
    parts, layout, offset = [], [], 0
    for rank in batch:
        per_rank = []
        for tokens in rank:
            inputs = np.ascontiguousarray(tokens[:, :-1], np.int32).reshape(-1)
            targets = np.ascontiguousarray(tokens[:, 1:], np.int32).reshape(-1)
            order, starts = positions_by_token(inputs, vocab_size)
            fields = []
            for part in (inputs, targets, order, starts):
                parts.append(part)
                fields.append((offset, part.shape[0]))
                offset += part.shape[0]
            per_rank.append(fields)
        layout.append(per_rank)
    return np.concatenate(parts).astype(np.int32, copy=False), layout


def micro_batches(packed, layout: Layout) -> list[list[MicroBatch]]:
    """:class:`MicroBatch` views of ``packed`` (a host or device array) by ``layout``."""
    return [[MicroBatch(*(packed[o:o + n] for o, n in fields), rows=fields[0][1]) for fields in per_rank]
            for per_rank in layout]  # fmt: skip
