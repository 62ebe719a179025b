"""One training step: the function both the trainer and the replayer call.

Its output bits are a pure function of (state bits, batch bits, config): every kernel it
calls is deterministic (see their modules), and the sequence of calls is fixed here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .adamw import adamw_update
from .errors import BatchFormatError
from .layers import (
    embedding_backward,
    embedding_forward,
    linear_backward,
    linear_forward,
    relu_backward,
    relu_forward,
)
from .loss import softmax_cross_entropy
from .model import PARAM_NAMES, ModelConfig, TrainState


@dataclass(frozen=True)
class StepReport:
    """What a step observed. ``loss`` is the exact float32 mean loss *before* the update."""

    loss: np.float32


def check_batch(batch: np.ndarray, config: ModelConfig) -> None:
    """Raise :class:`BatchFormatError` unless ``batch`` is int32 (batch_size, seq_len + 1)
    with every token in ``[0, vocab_size)``."""
    shape = (config.batch_size, config.seq_len + 1)
    if not isinstance(batch, np.ndarray) or batch.dtype != np.int32:
        raise BatchFormatError(f"batch must be an int32 array, got {getattr(batch, 'dtype', type(batch))}")
    if batch.shape != shape:
        raise BatchFormatError(f"batch must have shape {shape}, got {batch.shape}")
    if batch.size and (batch.min() < 0 or batch.max() >= config.vocab_size):
        raise BatchFormatError(f"batch tokens must be in [0, {config.vocab_size})")


def forward_backward(params: dict[str, np.ndarray], batch: np.ndarray) -> tuple[np.float32, dict[str, np.ndarray]]:
    """Mean next-token loss and the gradient of every parameter (no update)."""
    inputs = np.ascontiguousarray(batch[:, :-1]).reshape(-1)
    targets = np.ascontiguousarray(batch[:, 1:]).reshape(-1)
    x = embedding_forward(params["E"], inputs)
    z1 = linear_forward(x, params["W1"], params["b1"])
    h = relu_forward(z1)
    logits = linear_forward(h, params["W2"], params["b2"])
    loss, dlogits = softmax_cross_entropy(logits, targets)
    dh, d_w2, d_b2 = linear_backward(h, params["W2"], dlogits)
    dz1 = relu_backward(z1, dh)
    dx, d_w1, d_b1 = linear_backward(x, params["W1"], dz1)
    d_e = embedding_backward(inputs, dx, params["E"].shape[0])
    return np.float32(loss), {"E": d_e, "W1": d_w1, "b1": d_b1, "W2": d_w2, "b2": d_b2}


def train_step(state: TrainState, batch: np.ndarray, config: ModelConfig) -> tuple[TrainState, StepReport]:
    """Forward, backward and one AdamW update; returns a new state (``step + 1``) and the loss.

    ``batch`` is int32 (batch_size, seq_len + 1): inputs ``batch[:, :-1]`` predict targets
    ``batch[:, 1:]``. ``state`` is not modified.
    """
    check_batch(batch, config)
    hp = config.hyper32()
    loss, grads = forward_backward(state.params, batch)
    beta1_pow = np.float32(state.beta1_pow * hp["beta1"])  # beta1**(step+1), one rounding per step
    beta2_pow = np.float32(state.beta2_pow * hp["beta2"])
    params, m, v = {}, {}, {}
    for name in PARAM_NAMES:
        p_new, m_new, v_new = adamw_update(
            state.params[name], grads[name], state.m[name], state.v[name],
            hp["lr"], hp["beta1"], hp["beta2"], hp["eps"], hp["weight_decay"], beta1_pow, beta2_pow,
        )  # fmt: skip
        for a in (p_new, m_new, v_new):
            a.flags.writeable = False
        params[name], m[name], v[name] = p_new, m_new, v_new
    new_state = TrainState(params, m, v, state.step + 1, beta1_pow, beta2_pow)
    return new_state, StepReport(loss=loss)
