"""Token + position embedding, forward and backward (the token table is tied to the head).

Forward, row ``r = b·T + t``: ``x[r, c] = fadd(wte[tokens[r], c], wpe[t, c])``.

Backward:

* token table: the head's gradient ``dwte`` (a matmul) first, then every position's row added in
  **ascending position order**: for p = 0, 1, …: ``dwte[tokens[p]] = fadd(dwte[tokens[p]], dx[p])``.
  A fixed-order scatter-add, no atomics. Kernels walk a counting sort of the positions by token
  (:func:`positions_by_token`, stable, so positions stay ascending within a token): each token's
  row is owned by one thread, which applies that token's positions in ascending order.
* position table: ``dwpe[t, c] = Σ_b dx[b·T + t, c]`` over the batch rows, in the order of
  :mod:`.reduction` (a column sum of ``dx`` viewed as (b, T·d)).

Why deterministic: the forward is one add per element; every backward element is a sequence of
adds in an order fixed by positions alone.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .jit import CPU_OPTIONS, cpu_kernels, device
from .primitives import fadd


def positions_by_token(tokens: np.ndarray, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """``(order, starts)``: positions sorted by token (stable), and ``starts[t]:starts[t+1]``
    the slice of ``order`` holding token t's positions (integer work on the host)."""
    order = np.argsort(tokens, kind="stable").astype(np.int32)
    starts = np.zeros(vocab_size + 1, np.int32)
    np.cumsum(np.bincount(tokens, minlength=vocab_size), out=starts[1:])
    return order, starts


@device
def embed_row(wte, wpe, tokens, x, r):
    t = r % wpe.shape[0]
    for c in range(x.shape[1]):
        x[r, c] = fadd(wte[tokens[r], c], wpe[t, c])


@device
def scatter_add_element(dwte, dx, order, starts, token, c):
    """``dwte[token, c]`` plus column c of token's positions, in ascending position order."""
    for idx in range(starts[token], starts[token + 1]):
        dwte[token, c] = fadd(dwte[token, c], dx[order[idx], c])


@device
def scatter_add_row(dwte, dx, order, starts, token):
    for c in range(dwte.shape[1]):
        scatter_add_element(dwte, dx, order, starts, token, c)


def _build(rows, parallel):
    @njit(parallel=parallel, **CPU_OPTIONS)
    def forward(wte, wpe, tokens):
        n = tokens.shape[0]
        x = np.empty((n, wte.shape[1]), np.float32)
        for r in rows(n):
            embed_row(wte, wpe, tokens, x, r)
        return x

    @njit(parallel=parallel, **CPU_OPTIONS)
    def scatter_add(dwte, dx, order, starts):
        for token in rows(dwte.shape[0]):
            scatter_add_row(dwte, dx, order, starts, token)

    return forward, scatter_add


KERNELS = cpu_kernels(_build)
"""``{parallel: (forward(wte, wpe, tokens) -> x, scatter_add(dwte, dx, order, starts) in place)}``."""


def embed_reference(wte, wpe, tokens):
    return wte[tokens] + np.tile(wpe, (tokens.shape[0] // wpe.shape[0], 1))


def scatter_add_reference(dwte, dx, tokens):
    out = dwte.copy()
    for p, t in enumerate(tokens):
        out[t] = out[t] + dx[p]
    return out
