"""Accuracy against float64 PyTorch: the loss, every gradient and one whole optimizer step
(clipping + AdamW) of the tiny preset, after a few steps so that gains and moments are not trivial."""

import numpy as np
import pytest
import torch

from open1b.deterministic import PRESETS, batch_for_step, builtin_dataset, init_state, torch_twin, train_step
from open1b.deterministic.backend import cpu_backend
from open1b.deterministic.step import step_gradients

CONFIG, TOPOLOGY = PRESETS["tiny"].config, PRESETS["tiny"].topology
SEED = 3


@pytest.fixture(scope="module")
def trained():
    """(state after 4 steps, the batch of step 4)."""
    tokens, state = builtin_dataset(CONFIG), init_state(CONFIG, SEED)
    for k in range(4):
        state, _ = train_step(state, batch_for_step(tokens, SEED, k, CONFIG, TOPOLOGY), TOPOLOGY)
    return state, batch_for_step(tokens, SEED, 4, CONFIG, TOPOLOGY)


def max_rel(got: np.ndarray, ref: np.ndarray) -> float:
    """Largest absolute error over the largest reference magnitude (relative error of tiny
    elements means nothing in a sum-dominated tensor)."""
    return float(np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max())


def test_loss_and_every_gradient_match_float64(trained):
    state, batch = trained
    loss32, grads32 = step_gradients(state, batch, TOPOLOGY, cpu_backend(False))
    tp = torch_twin.to_torch(state.params, torch.float64)
    loss64 = float(torch_twin.loss_and_grads(tp, batch, CONFIG))
    assert abs(float(loss32[0]) - loss64) <= 3e-7 * loss64  # measured 2.5e-8
    assert set(grads32) == set(CONFIG.param_shapes())
    for name, g in grads32.items():
        assert g.dtype == np.float32
        assert max_rel(g, tp[name].grad.numpy()) <= 2e-5, name  # measured <= 2.4e-6


def test_one_optimizer_step_matches_float64(trained):
    state, batch = trained
    new_state, report = train_step(state, batch, TOPOLOGY)
    assert report.clip_coef < 1  # the clipping path is exercised
    tp = torch_twin.to_torch(state.params, torch.float64)
    opt = torch_twin.optimizer(tp, CONFIG)
    for name, t in tp.items():  # resume from the same moments
        opt.state[t] = {"step": torch.tensor(float(state.step), dtype=torch.float64),
                        "exp_avg": torch.tensor(state.m[name], dtype=torch.float64),
                        "exp_avg_sq": torch.tensor(state.v[name], dtype=torch.float64)}  # fmt: skip
    torch_twin.train_step(tp, opt, batch, CONFIG)
    for name, t in tp.items():
        update32 = new_state.params[name].astype(np.float64) - state.params[name]
        update64 = t.detach().numpy() - state.params[name]
        assert max_rel(update32, update64) <= 2e-4, name  # the update itself; measured <= 2.2e-5
        assert max_rel(new_state.m[name], opt.state[t]["exp_avg"].numpy()) <= 4e-6, name  # measured <= 3.8e-7
        assert max_rel(new_state.v[name], opt.state[t]["exp_avg_sq"].numpy()) <= 4e-6, name  # measured <= 2.7e-7
