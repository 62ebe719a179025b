"""Accuracy of one step against float64 PyTorch (autograd and torch.optim.AdamW)."""

import numpy as np
import torch

from open1b.deterministic import PARAM_NAMES, PRESETS, batch_for_step, corpus_tokens, init_state, train_step
from open1b.deterministic.adamw import adamw_update
from open1b.deterministic.step import forward_backward

CONFIG = PRESETS["skeleton"]


def torch_loss_and_grads(params, batch):
    t = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in params.items()}
    inputs = torch.tensor(batch[:, :-1].reshape(-1), dtype=torch.long)
    targets = torch.tensor(batch[:, 1:].reshape(-1), dtype=torch.long)
    h = torch.relu(t["E"][inputs] @ t["W1"] + t["b1"])
    loss = torch.nn.functional.cross_entropy(h @ t["W2"] + t["b2"], targets)
    loss.backward()
    return loss.item(), {k: v.grad.numpy() for k, v in t.items()}


def trained_state(steps):
    tokens, state = corpus_tokens(), init_state(CONFIG, seed=3)
    for _ in range(steps):
        state, _ = train_step(state, batch_for_step(tokens, 3, state.step, CONFIG), CONFIG)
    return state


def test_loss_and_gradients_match_float64():
    # After a few steps so that b1/b2 and the relu pattern are non-trivial.
    state = trained_state(5)
    batch = batch_for_step(corpus_tokens(), 3, 5, CONFIG)
    loss32, grads32 = forward_backward(state.params, batch)
    loss64, grads64 = torch_loss_and_grads(state.params, batch)
    assert abs(float(loss32) - loss64) <= 2e-6 * abs(loss64)  # measured 5.4e-8
    for name in PARAM_NAMES:
        g32, g64 = grads32[name].astype(np.float64), grads64[name]
        assert grads32[name].dtype == np.float32
        # Normalised by the largest element: relative error of small elements is meaningless.
        err = np.abs(g32 - g64).max() / np.abs(g64).max()
        assert err <= 1e-5, (name, err)  # measured <= 1.9e-7


def test_adamw_matches_torch_adamw_float64():
    # Three steps from zero moments with fixed gradients, against torch.optim.AdamW in float64.
    rng = np.random.default_rng(0)
    p0 = rng.standard_normal(1000).astype(np.float32)
    grads = [rng.standard_normal(1000).astype(np.float32) * np.float32(10.0**-k) for k in (0, 2, 4)]
    hp = CONFIG.hyper32()
    p, m, v = p0, np.zeros_like(p0), np.zeros_like(p0)
    b1p, b2p = np.float32(1), np.float32(1)
    tp = torch.tensor(p0, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.AdamW([tp], lr=CONFIG.lr, betas=(CONFIG.beta1, CONFIG.beta2), eps=CONFIG.eps,
                            weight_decay=CONFIG.weight_decay)  # fmt: skip
    for g in grads:
        b1p, b2p = b1p * hp["beta1"], b2p * hp["beta2"]
        p, m, v = adamw_update(p, g, m, v, hp["lr"], hp["beta1"], hp["beta2"], hp["eps"], hp["weight_decay"], b1p, b2p)
        tp.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()
    ref = tp.detach().numpy()
    assert p.dtype == np.float32
    # Parameters are O(1) and move by ~3e-2 in total; float32 carries ~6e-8 relative.
    err = np.abs(p.astype(np.float64) - ref).max()
    assert err <= 1e-6, err  # measured 4.5e-7 (float32(0.999) and rounding of p ~ 2 ulp)
