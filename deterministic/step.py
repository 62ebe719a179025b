"""One training step: the function both the trainer and the replayer call.

``train_step(state, batch, topology)`` computes, for every rank r and micro-batch μ, the loss
and gradients of ``batch[r, μ]`` (:func:`.gpt.forward_backward`, each scaled by one over the
step's target-token count), and sums them in the order of the run format:

1. within a rank, micro-batches in ascending order, folded from ``+0.0``;
2. across ranks, :mod:`.reduction`'s order with :data:`.reduction.RANK_GROUP` in place of
   ``K_CHUNK``: ranks folded in ascending order within consecutive groups, the group sums
   combined by the pairwise tree.

The loss is summed exactly like a gradient. Then the global gradient norm gives the clipping
coefficient and AdamW updates every parameter (:mod:`.optimizer`). One process replays a W-rank
step exactly because the order is a function of the topology alone.

Its output bits are a pure function of (state bits, batch bits, topology) on every backend.
A step whose loss or gradient norm is not finite raises :class:`.errors.NonFiniteError`: NaN
payloads are not portable, so such a state could never be verified.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .backend import default_backend
from .config import GPTConfig, Topology
from .errors import BatchFormatError, NonFiniteError
from .gpt import forward_backward
from .optimizer import AdamWScalars, clip_coefficient
from .reduction import RANK_GROUP, fixed_sum
from .state import TrainState

LOSS_KEY = "loss"


@dataclass(frozen=True)
class StepReport:
    """What a step observed: the exact float32 mean loss *before* the update, the global
    gradient norm and the clipping coefficient applied."""

    loss: np.float32
    grad_norm: np.float32
    clip_coef: np.float32


def check_batch(batch: np.ndarray, config: GPTConfig, topology: Topology) -> None:
    """Raise :class:`BatchFormatError` unless ``batch`` is int32
    (ranks, micro_batches, micro_batch_size, seq_len + 1) with tokens in ``[0, vocab_size)``."""
    shape = (topology.ranks, topology.micro_batches, topology.micro_batch_size, config.seq_len + 1)
    if not isinstance(batch, np.ndarray) or batch.dtype != np.int32:
        raise BatchFormatError(f"batch must be an int32 array, got {getattr(batch, 'dtype', type(batch))}")
    if batch.shape != shape:
        raise BatchFormatError(f"batch must have shape {shape}, got {batch.shape}")
    if batch.min() < 0 or batch.max() >= config.vocab_size:
        raise BatchFormatError(f"batch tokens must be in [0, {config.vocab_size})")


class _GroupedTree:
    """Sums pushed terms in :mod:`.reduction`'s order with chunks of ``group``: a fold from +0.0
    within each group (``plus_zero`` is its first step), then the streaming pairwise tree over
    group sums (:func:`.reduction.stack_push`'s binary counter). Terms are dicts of arrays summed
    key by key with ``add``."""

    def __init__(self, group: int, add: Callable, plus_zero: Callable) -> None:
        self.group, self.add, self.plus_zero = group, add, plus_zero
        self.stack: list[dict | None] = []
        self.count = 0  # group sums pushed into the tree
        self.acc: dict | None = None
        self.in_group = 0

    def push(self, term: dict) -> None:
        if self.acc is None:
            self.acc = {k: self.plus_zero(a) for k, a in term.items()}
        else:
            self.acc = {k: self.add(self.acc[k], term[k]) for k in term}
        self.in_group += 1
        if self.in_group == self.group:
            self._push_group()

    def _push_group(self) -> None:
        value, self.acc, self.in_group = self.acc, None, 0
        level = 0
        while (self.count >> level) & 1:
            value = {k: self.add(self.stack[level][k], value[k]) for k in value}
            self.stack[level] = None
            level += 1
        if level == len(self.stack):
            self.stack.append(None)
        self.stack[level] = value
        self.count += 1

    def total(self) -> dict:
        if self.acc is not None:
            self._push_group()
        total = None
        for level in range(len(self.stack)):
            if (self.count >> level) & 1:
                block = self.stack[level]
                total = block if total is None else {k: self.add(block[k], total[k]) for k in block}
        return total


def _read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def step_gradients(state: TrainState, batch: np.ndarray, topology: Topology, be) -> tuple[np.float32, dict]:
    """The step's mean loss and summed gradients (backend arrays), in the order of the module doc."""
    config = state.config
    inv_n = np.float32(1) / np.float32(topology.sequences * config.seq_len)
    params = {k: be.upload(a) for k, a in state.params.items()}
    ranks = _GroupedTree(RANK_GROUP, be.add, be.plus_zero)
    for rank in range(topology.ranks):
        micro = _GroupedTree(topology.micro_batches, be.add, be.plus_zero)  # one group: a plain fold
        for mb in range(topology.micro_batches):
            loss, grads = forward_backward(params, batch[rank, mb], inv_n, config, be)
            grads[LOSS_KEY] = be.upload(np.array([loss], np.float32))
            micro.push(grads)
        ranks.push(micro.total())
    summed = ranks.total()
    return np.float32(be.download(summed.pop(LOSS_KEY))[0]), summed


def train_step(
    state: TrainState, batch: np.ndarray, topology: Topology, *, backend=None
) -> tuple[TrainState, StepReport]:
    """Forward, backward, gradient reduction, clipping and one AdamW update.

    Returns a new state (``step + 1``) and a :class:`StepReport`; ``state`` is not modified.
    ``backend`` (default: :func:`.backend.default_backend`) changes the speed, never the bits.
    """
    config = state.config
    check_batch(batch, config, topology)
    be = backend or default_backend(config)
    hp = config.hyper32()
    loss, grads = step_gradients(state, batch, topology, be)
    norm = np.sqrt(fixed_sum(np.array([be.sumsq(grads[name]) for name in config.param_shapes()], np.float32)))
    if not (np.isfinite(loss) and np.isfinite(norm)):
        raise NonFiniteError(f"step {state.step}: loss {loss}, gradient norm {norm}")
    coef = clip_coefficient(norm, hp["grad_clip"])
    beta1_pow = np.float32(state.beta1_pow * hp["beta1"])  # beta1**(step+1), one rounding per step
    beta2_pow = np.float32(state.beta2_pow * hp["beta2"])
    new_p, new_m, new_v = {}, {}, {}
    for name, shape in config.param_shapes().items():
        scalars = AdamWScalars.for_step(
            lr=hp["lr"], beta1=hp["beta1"], beta2=hp["beta2"], eps=hp["eps"],
            weight_decay=hp["weight_decay"] if len(shape) >= 2 else np.float32(0),
            beta1_pow=beta1_pow, beta2_pow=beta2_pow, coef=coef,
        )  # fmt: skip
        p, m, v = be.adamw(be.upload(state.params[name]), grads[name], be.upload(state.m[name]),
                           be.upload(state.v[name]), scalars)  # fmt: skip
        new_p[name], new_m[name], new_v[name] = (_read_only(be.download(a)) for a in (p, m, v))
    new_state = TrainState(config, new_p, new_m, new_v, state.step + 1, beta1_pow, beta2_pow)
    return new_state, StepReport(loss=loss, grad_norm=np.float32(norm), clip_coef=coef)
