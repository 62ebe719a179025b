"""The same GPT and optimiser step in PyTorch: the float64 oracle of the accuracy tests and the
float32 eager baseline of the benchmarks. Only tests and ``bench/`` import this module; the
engine never imports torch.

It follows :mod:`.gpt` and :mod:`.step` in mathematics, not in rounding: idiomatic torch ops
(``rms_norm``, ``scaled_dot_product_attention``, ``gelu(approximate="tanh")``, ``cross_entropy``,
``clip_grad_norm_``, ``AdamW``) with whatever order and fusion they use.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .config import GPTConfig


def to_torch(params: dict[str, np.ndarray], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Leaf tensors (``requires_grad``) holding ``params`` in ``dtype``."""
    return {k: torch.tensor(np.asarray(v), dtype=dtype, requires_grad=True) for k, v in params.items()}


def loss_sum(tp: dict[str, torch.Tensor], tokens: torch.Tensor, config: GPTConfig) -> torch.Tensor:
    """Sum (not mean) of the next-token cross-entropy over ``tokens`` (b, T + 1)."""
    b, t_len = tokens.shape[0], config.seq_len
    h_dim, hd, d = config.n_heads, config.head_dim, config.d_model
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    x = tp["wte"][inputs] + tp["wpe"]
    for layer in range(config.n_layers):
        p = lambda name: tp[f"h{layer}.{name}"]  # noqa: E731
        h = F.rms_norm(x, (d,), p("ln1"), config.norm_eps)
        q, k, v = (h @ p("attn_qkv")).split(d, dim=-1)
        q, k, v = (y.view(b, t_len, h_dim, hd).transpose(1, 2) for y in (q, k, v))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t_len, d)
        x = x + o @ p("attn_out")
        h = F.rms_norm(x, (d,), p("ln2"), config.norm_eps)
        x = x + F.gelu(h @ p("mlp_fc"), approximate="tanh") @ p("mlp_proj")
    logits = F.rms_norm(x, (d,), tp["ln_f"], config.norm_eps) @ tp["wte"].T
    return F.cross_entropy(logits.reshape(-1, config.vocab_size), targets.reshape(-1), reduction="sum")


def loss_and_grads(tp: dict[str, torch.Tensor], batch: np.ndarray, config: GPTConfig) -> torch.Tensor:
    """Mean loss over every target token of ``batch`` (ranks, micro, rows, T + 1); gradients land
    in ``tp[...].grad`` (accumulated micro-batch by micro-batch, as a trainer would)."""
    flat = torch.tensor(batch.reshape(-1, batch.shape[-1]), dtype=torch.long, device=tp["wte"].device)
    per_micro = batch.shape[2]
    n_tokens = flat.shape[0] * config.seq_len
    total = 0.0
    for start in range(0, flat.shape[0], per_micro):
        loss = loss_sum(tp, flat[start : start + per_micro], config) / n_tokens
        loss.backward()
        total += loss.detach()
    return total


def optimizer(tp: dict[str, torch.Tensor], config: GPTConfig) -> torch.optim.AdamW:
    """AdamW with decay on matrices only, as :mod:`.step` applies it."""
    decay = [t for t in tp.values() if t.ndim >= 2]
    no_decay = [t for t in tp.values() if t.ndim < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=config.lr, betas=(config.beta1, config.beta2), eps=config.eps,
    )  # fmt: skip


def train_step(tp: dict[str, torch.Tensor], opt: torch.optim.Optimizer, batch: np.ndarray, config: GPTConfig):
    """One step: zero grads, loss and gradients, global-norm clipping, AdamW. Returns the loss."""
    opt.zero_grad(set_to_none=True)
    loss = loss_and_grads(tp, batch, config)
    torch.nn.utils.clip_grad_norm_(list(tp.values()), config.grad_clip)
    opt.step()
    return loss
