"""The GPT's forward and backward pass over one micro-batch, as a fixed sequence of kernels.

The sequence below *is* the model's definition: every kernel call, its operands and their order
(including which operand of each residual add comes first) is part of the spec. Shapes: ``b``
sequences of ``T`` positions, ``n = b·T`` rows, ``d`` model width, ``H`` heads.

Forward::

    x = wte[tokens] + wpe                                     (embedding)
    per layer: h = rmsnorm(x; ln1);  qkv = h @ attn_qkv;  o = attention(qkv)
               x = x + o @ attn_out;  h = rmsnorm(x; ln2);  x = x + gelu(h @ mlp_fc) @ mlp_proj
    logits = rmsnorm(x; ln_f) @ wteᵀ;  loss = cross_entropy(logits, targets)

The attention products name the causal zeros they have (:data:`.matmul.CAUSAL_OUTPUT`, …) so
that a kernel may skip work; the results are the full products either way.

Backward mirrors it in reverse; the residual stream's gradient enters each norm's backward as
``dres`` (``dx = dres + dnorm``), and the tied table's gradient is the head's product followed by
the embedding scatter-add.

A backend with ``fused`` set runs each product whose only consumer is elementwise (the two
residual adds, the GELU and its backward) as one kernel (:mod:`.epilogue`); the bits are the same.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .attention import attention_scale
from .config import GPTConfig
from .matmul import A_LOWER, A_UPPER, CAUSAL_OUTPUT
from .microbatch import MicroBatch


def _layer_names(layer: int) -> tuple[str, ...]:
    return tuple(f"h{layer}.{p}" for p in ("ln1", "attn_qkv", "attn_out", "ln2", "mlp_fc", "mlp_proj"))


def _layer_forward(x, w: tuple, config: GPTConfig, eps, scale, be, *, full: bool = True):
    """One block's forward from its input ``x``: ``(x_out, activations)``. ``full=False`` (a recompute
    for the backward) stops before the last product, which the backward does not read: x_out is None."""
    seq_len, heads, d = config.seq_len, config.n_heads, config.d_model
    ln1, w_qkv, w_out, ln2, w_fc, w_proj = w
    h, rstd1 = be.rmsnorm(x, ln1, eps)
    qkv = be.matmul(h, w_qkv)
    q, k, v = (be.split_heads(qkv, i * d, d, seq_len, heads) for i in range(3))
    p = be.causal_softmax(be.matmul(q, k, False, True, CAUSAL_OUTPUT), scale)
    att = be.merge_heads(be.matmul(p, v, False, False, A_LOWER), seq_len, heads)
    x_mid = _residual(be, x, att, w_out)
    h2, rstd2 = be.rmsnorm(x_mid, ln2, eps)
    if be.fused:
        u, a = be.matmul_gelu(h2, w_fc)
    else:
        u = be.matmul(h2, w_fc)
        a = be.gelu(u)
    x_out = _residual(be, x_mid, a, w_proj) if full else None
    return x_out, (x, rstd1, h, q, k, v, p, att, x_mid, rstd2, h2, u, a)


# Where a product's only consumer is elementwise, a fused backend applies it in the product's
# epilogue (:mod:`.epilogue`); the result has the same bits as the two ops spelled out, which
# are the sequence docs/run-format.md §11 lists (the path a trace producer takes: fused=False).

def _residual(be, x, a, w):
    """``add(x, a @ w)``."""
    return be.matmul_add(x, a, w) if be.fused else be.add(x, be.matmul(a, w))


def _layer_backward(acts: list, w: tuple, names: tuple, dx, grads: dict, config: GPTConfig, scale, be):
    """One block's backward given its forward's activations ``acts`` (a list, emptied here) and the
    residual stream's gradient ``dx`` at its output; fills its gradients into ``grads`` and returns
    ``dx`` at its input. Each activation is dropped after its last use, so a recompute holds at
    most one block's, and the attention's three T×T arrays only while the softmax's backward runs."""
    seq_len, heads, d = config.seq_len, config.n_heads, config.d_model
    ln1, w_qkv, w_out, ln2, w_fc, w_proj = w
    x_in, rstd1, h, q, k, v, p, att, x_mid, rstd2, h2, u, a = acts
    acts.clear()
    # x_out = x_mid + gelu(h2 @ w_fc) @ w_proj
    grads[names[5]] = be.matmul(a, dx, True, False)
    if be.fused:
        du = be.matmul_gelu_backward(u, dx, w_proj, False, True)
    else:
        du = be.gelu_backward(u, be.matmul(dx, w_proj, False, True))
    del a, u
    grads[names[4]] = be.matmul(h2, du, True, False)
    dx, dg = be.rmsnorm_backward(x_mid, ln2, rstd2, be.matmul(du, w_fc, False, True), dx)
    del h2, du, x_mid
    grads[names[3]] = be.sum_rows(dg)
    # x_mid = x_in + attention(h @ w_qkv) @ w_out
    grads[names[2]] = be.matmul(att, dx, True, False)
    del att
    do = be.split_heads(be.matmul(dx, w_out, False, True), 0, d, seq_len, heads)
    dv = be.matmul(p, do, True, False, A_UPPER)
    ds = be.causal_softmax_backward(p, be.matmul(do, v, False, True, CAUSAL_OUTPUT), scale)
    del p, do, v
    dq, dk = be.matmul(ds, k, False, False, A_LOWER), be.matmul(ds, q, True, False, A_UPPER)
    dqkv = be.merge_qkv(dq, dk, dv, seq_len, heads)
    grads[names[1]] = be.matmul(h, dqkv, True, False)
    dx, dg = be.rmsnorm_backward(x_in, ln1, rstd1, be.matmul(dqkv, w_qkv, False, True), dx)
    grads[names[0]] = be.sum_rows(dg)
    return dx


def forward_backward(params: dict, micro: MicroBatch, inv_n: np.float32, config: GPTConfig, be, *,
                     recompute: bool = True, on_grad: Callable[[str, object], None] | None = None,
                     release: Callable[[tuple[str, ...]], None] | None = None):
    """``(loss, grads)`` of one micro-batch (:class:`.microbatch.MicroBatch`, on the backend);
    the loss (a (1,) backend array) and every gradient already scaled by ``inv_n`` (one over the
    *step's* number of target tokens). ``params`` and the results are backend arrays.

    ``recompute`` keeps only each block's input through the forward and recomputes the block's
    forward (:func:`_layer_forward`) just before its backward: one block's activations (its
    attention probabilities among them) are alive at a time instead of all of them. The recompute
    calls the same kernels on the same inputs, so the activations, and every result, have the
    same bits as without it (``recompute=False`` keeps them all, and the tests compare the two).

    ``on_grad(name, grad)``, if given, takes each parameter's gradient as soon as it is final (a
    block's after its backward, ``wte``'s and ``wpe``'s last), and the returned dict is empty: a
    caller that sums gradients across micro-batches or ranks adds each one in as it comes, and
    never holds a second whole gradient (:func:`.step.step_gradients`). The values are the same.

    ``release(names)``, if given, is told when parameters ``names`` have had their last use in this
    micro-batch (``wpe`` after the embedding, ``wte`` and ``ln_f`` after the head's backward, a
    block's after its backward), and this function lets go of its own references to them then: a
    caller that can read the parameters again drops them, so that in the step's last backward the
    parameters shrink as the gradients grow (:func:`.step.step_gradients`' ``spill``)."""
    seq_len, d = config.seq_len, config.d_model
    eps = config.hyper32()["norm_eps"]
    scale = attention_scale(config.head_dim)
    rows = micro.rows
    weights = [tuple(params[n] for n in _layer_names(layer)) for layer in range(config.n_layers)]

    # ---- forward -------------------------------------------------------------------------
    x = be.embed(params["wte"], params["wpe"], micro.inputs)
    _release(("wpe",), release)
    saved = []
    for layer in range(config.n_layers):
        x_out, acts = _layer_forward(x, weights[layer], config, eps, scale, be)
        saved.append(x if recompute else acts)
        x = x_out
    del acts
    xf, rstd_f = be.rmsnorm(x, params["ln_f"], eps)
    logits = be.matmul(xf, params["wte"], False, True)
    loss, dlogits = be.loss_and_grad(logits, micro.targets, inv_n)

    # ---- backward ------------------------------------------------------------------------
    grads = {}
    dxf = be.matmul(dlogits, params["wte"])
    d_wte = be.matmul(dlogits, xf, True, False)
    dx, dg = be.rmsnorm_backward(x, params["ln_f"], rstd_f, dxf, be.zeros((rows, d)))
    grads["ln_f"] = be.sum_rows(dg)
    del logits, dlogits, dxf, xf, dg, x
    _release(("wte", "ln_f"), release)
    _hand_over(grads, ("ln_f",), on_grad)
    for layer in reversed(range(config.n_layers)):
        kept = saved.pop()
        acts = list(_layer_forward(kept, weights[layer], config, eps, scale, be, full=False)[1] if recompute else kept)
        del kept  # the list is the activations' only holder, and the backward empties it
        dx = _layer_backward(acts, weights[layer], _layer_names(layer), dx, grads, config, scale, be)
        if release is not None:
            weights[layer] = None
            _release(_layer_names(layer), release)
        _hand_over(grads, _layer_names(layer), on_grad)
    be.scatter_add_sorted(d_wte, dx, micro.order, micro.starts)
    grads["wte"] = d_wte
    grads["wpe"] = be.sum_rows(dx.reshape(rows // seq_len, seq_len * d)).reshape(seq_len, d)
    del d_wte
    _hand_over(grads, ("wte", "wpe"), on_grad)
    return loss, {name: grads[name] for name in config.param_shapes() if name in grads}


def _release(names: tuple[str, ...], release: Callable[[tuple[str, ...]], None] | None) -> None:
    if release is not None:
        release(names)


def _hand_over(grads: dict, names: tuple[str, ...], on_grad: Callable[[str, object], None] | None) -> None:
    """Give the final gradients ``names`` to ``on_grad`` (and drop them here), if there is one."""
    if on_grad is not None:
        for name in names:
            on_grad(name, grads.pop(name))
