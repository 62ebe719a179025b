"""Activation recompute (gpt.forward_backward's ``recompute``) changes memory and time, never a bit:
the state, the witness, the fingerprint and every micro-batch's gradient (what a spot check's answer
is cut from) are those of the step that keeps every activation, and those pinned before it existed."""

import numpy as np
import pytest

from open1b.deterministic import PRESETS, batch_for_step, builtin_dataset, init_state, train_step
from open1b.deterministic.backend import default_backend
from open1b.deterministic.fingerprint import fingerprinted_step
from open1b.deterministic.gpt import forward_backward
from open1b.deterministic.runfile import state_link
from open1b.deterministic.step import _inv_tokens
from open1b.protocol.witness import WITNESS_SEQUENTIAL

SEED = 7

# `tiny` from init_state(seed 7), step 0, by the code before recompute existed (commit 49fe3ec); its
# witness is the rule runs had then (v1, sequential: docs/run-format.md §5.1).
PINNED_TINY_STEP0 = {
    "root": "bb3b9855a53e61a19428a6c45ddc429dbd46abea6fbf26e147e9abe448abd490",
    "witness": "ef3bab15fc66b81ef882ae5f67e3173bd0db319f8b95de573e54fa35789085be",
    "fingerprint": "c64e22f769d9db57e64bec49e413378d197295d6f49250abfdb9c6da4024d60f",
}


def _step0(preset: str):
    p = PRESETS[preset]
    state = init_state(p.config, SEED)
    return p, state, batch_for_step(builtin_dataset(p.config), SEED, 0, p.config, p.topology)


def test_the_default_step_keeps_the_pinned_bits():
    p, state, batch = _step0("tiny")
    new, report, fingerprint = fingerprinted_step(state, batch, p.topology)
    assert state_link(new, batch)[-1].hex() == PINNED_TINY_STEP0["root"]
    assert fingerprint.commitment.hex() == PINNED_TINY_STEP0["fingerprint"]
    _, v1 = train_step(state, batch, p.topology, witness_rule=WITNESS_SEQUENTIAL)
    assert v1.witness.hex() == PINNED_TINY_STEP0["witness"]
    assert report.witness == train_step(state, batch, p.topology)[1].witness  # the default rule, v2, alike


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_a_micro_batch_with_and_without_recompute_has_the_same_bits(preset):
    p, state, batch = _step0(preset)
    be = default_backend(p.config)
    micro = be.micro_batches(batch, p.config.vocab_size)[0][0]
    inv_n = _inv_tokens(p.config, p.topology)
    loss_r, grads_r = forward_backward(state.params, micro, inv_n, p.config, be, recompute=True)
    loss_k, grads_k = forward_backward(state.params, micro, inv_n, p.config, be, recompute=False)
    assert np.asarray(loss_r).tobytes() == np.asarray(loss_k).tobytes()
    assert list(grads_r) == list(grads_k)
    assert all(grads_r[n].tobytes() == grads_k[n].tobytes() for n in grads_r)


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_a_step_with_and_without_recompute_has_the_same_bits(preset):
    p, state, batch = _step0(preset)
    with_r, report_r = train_step(state, batch, p.topology, recompute=True)
    without, report_k = train_step(state, batch, p.topology, recompute=False)
    assert state_link(with_r, batch) == state_link(without, batch)
    assert report_r == report_k  # loss, gradient norm, clipping coefficient and witness, bitwise
