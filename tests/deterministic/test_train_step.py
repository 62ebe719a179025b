"""train_step: exact replay, save/reload, sensitivity to every input, the cross-rank order, and the
same bits on every backend, thread count and CPU target."""

import os
import subprocess
import sys

import numpy as np
import pytest

from open1b.deterministic import (
    PRESETS, BatchFormatError, NonFiniteError, Topology, TrainState, batch_for_step, builtin_dataset, init_state,
    train_step,
)  # fmt: skip
from open1b.deterministic.backend import cpu_backend
from open1b.deterministic.gpt import forward_backward
from open1b.deterministic.reduction import RANK_GROUP, fixed_sum
from open1b.deterministic.selfcheck import state_fingerprint
from open1b.deterministic.step import step_gradients

from .conftest import MICRO, F, micro_batch, same_bits

CONFIG, TOPOLOGY = PRESETS["tiny"].config, PRESETS["tiny"].topology
SEED = 11


def run(state: TrainState, steps: int, backend=None) -> TrainState:
    tokens = builtin_dataset(CONFIG)
    for _ in range(steps):
        state, _ = train_step(state, batch_for_step(tokens, SEED, state.step, CONFIG, TOPOLOGY), TOPOLOGY,
                              backend=backend)  # fmt: skip
    return state


@pytest.fixture(scope="module")
def after_two():
    """The state after two steps (non-zero moments) and the batch of step 2."""
    return run(init_state(CONFIG, SEED), 2), batch_for_step(builtin_dataset(CONFIG), SEED, 2, CONFIG, TOPOLOGY)


def test_replay_is_bit_exact_and_does_not_mutate_its_input():
    s0 = init_state(CONFIG, SEED)
    before = state_fingerprint(s0)
    a, b = run(s0, 3), run(init_state(CONFIG, SEED), 3)
    assert a.step == 3 and state_fingerprint(a) == state_fingerprint(b)
    assert state_fingerprint(s0) == before and s0.step == 0
    assert all(not t.flags.writeable and t.dtype == np.float32 for t in a.tensors().values())


def test_serial_and_parallel_kernels_give_the_same_bits():
    serial = run(init_state(CONFIG, SEED), 3, cpu_backend(False))
    parallel = run(init_state(CONFIG, SEED), 3, cpu_backend(True))
    assert state_fingerprint(serial) == state_fingerprint(parallel)


def test_fused_epilogues_give_the_unfused_bits():
    # The residual adds, GELU and its backward in the products' epilogues (:mod:`.epilogue`)
    # against the ops spelled out: every tensor of the state and the step's reports.
    def steps(backend):
        tokens, state, reports = builtin_dataset(CONFIG), init_state(CONFIG, SEED), []
        for _ in range(2):
            state, report = train_step(state, batch_for_step(tokens, SEED, state.step, CONFIG, TOPOLOGY), TOPOLOGY,
                                       backend=backend)  # fmt: skip
            reports.append(report)
        return state_fingerprint(state), reports

    assert cpu_backend(False).fused and not cpu_backend(False, fused=False).fused
    assert steps(cpu_backend(False)) == steps(cpu_backend(False, fused=False))


def test_save_reload_replay_equals_uninterrupted(tmp_path):
    from safetensors.numpy import load_file, save_file

    straight = run(init_state(CONFIG, SEED), 4)
    mid = run(init_state(CONFIG, SEED), 2)
    save_file(mid.tensors(), str(tmp_path / "state.safetensors"))
    resumed = run(TrainState.from_tensors(load_file(str(tmp_path / "state.safetensors")), mid.step, CONFIG), 2)
    assert state_fingerprint(resumed) == state_fingerprint(straight)


def flip_bit(a: np.ndarray, index: int, bit: int) -> np.ndarray:
    a = np.array(a)
    a.view(np.uint32 if a.dtype == np.float32 else np.int32).reshape(-1)[index] ^= 1 << bit
    return a


@pytest.mark.parametrize("key", list(init_state(CONFIG, 0).tensors()))
def test_a_flipped_bit_in_any_state_tensor_changes_the_step(after_two, key):
    # Which bit: the top mantissa bit (22) of the tensor's largest element, which moves that
    # element by a quarter to a half of its magnitude. The element's own update is a*x + b with
    # |a| >= 0.9 (p·(1 - lr·wd), beta1·m, beta2·v, beta_pow·beta), so the change reaches the
    # output tensor of the same name and cannot round away. (A lowest-bit flip can: see below.)
    state, batch = after_two
    tensors = {k: np.array(v) for k, v in state.tensors().items()}
    tensors[key] = flip_bit(tensors[key], int(np.abs(tensors[key]).argmax()), 22)
    flipped = TrainState.from_tensors(tensors, state.step, CONFIG)
    out, ref = train_step(flipped, batch, TOPOLOGY)[0], train_step(state, batch, TOPOLOGY)[0]
    assert not same_bits(out.tensors()[key], ref.tensors()[key])


def test_a_lowest_bit_flip_can_be_rounded_away(after_two):
    # Why the replayer also hashes the *input* state (replay.py): a step is not injective. In
    # m' = 0.9·m + 0.1·g, an element whose gradient term dwarfs its moment has an ulp far below
    # that of m', so flipping the moment's lowest bit usually leaves m' (and the step) unchanged.
    state, batch = after_two
    _, grads = step_gradients(state, batch, TOPOLOGY, cpu_backend(False))
    m, g = state.m["h0.mlp_fc"].reshape(-1), grads["h0.mlp_fc"].reshape(-1)
    candidates = np.argsort(-np.abs(g) / np.maximum(np.abs(m), F(1e-30)))[:10]
    reference = state_fingerprint(train_step(state, batch, TOPOLOGY)[0])
    absorbed = 0
    for index in candidates:
        tensors = {k: np.array(v) for k, v in state.tensors().items()}
        tensors["adam_m/h0.mlp_fc"] = flip_bit(tensors["adam_m/h0.mlp_fc"], int(index), 0)
        out = train_step(TrainState.from_tensors(tensors, state.step, CONFIG), batch, TOPOLOGY)[0]
        absorbed += state_fingerprint(out) == reference
    assert absorbed > 0


@pytest.mark.parametrize("where", [(0, 0, 0, 0), (1, 0, 1, 17), (1, 1, 1, -1)], ids=["first-input", "middle", "last-target"])
def test_a_flipped_batch_token_changes_the_step(after_two, where):
    state, batch = after_two
    other = batch.copy()
    other[where] ^= 1
    assert state_fingerprint(train_step(state, batch, TOPOLOGY)[0]) != state_fingerprint(
        train_step(state, other, TOPOLOGY)[0])


def test_rejects_malformed_batch_and_non_finite_steps(after_two):
    state, good = after_two
    for bad in (good.astype(np.int64), good[..., :-1].copy(), good[:1].copy(), np.full_like(good, 256),
                np.full_like(good, -1)):  # fmt: skip
        with pytest.raises(BatchFormatError):
            train_step(state, bad, TOPOLOGY)
    tensors = {k: np.array(v) for k, v in state.tensors().items()}
    tensors["param/h0.mlp_fc"][0, 0] = np.inf
    with pytest.raises(NonFiniteError):
        train_step(TrainState.from_tensors(tensors, state.step, CONFIG), good, TOPOLOGY)


def test_rank_reduction_follows_the_spec_order():
    # 10 ranks x 2 micro-batches (RANK_GROUP = 8: one full group and one partial, joined by the
    # tree), recomputed here from per-micro-batch gradients with numpy float32 in the documented
    # order: fold micro-batches from +0.0 per rank, then the chunked sum over ranks.
    topology = Topology(ranks=10, micro_batches=2, micro_batch_size=1)
    state, batch = init_state(MICRO, 5), micro_batch(0, topology)
    be = cpu_backend(False)
    inv_n = F(1) / F(topology.sequences * MICRO.seq_len)
    per_rank = []
    for rank in range(topology.ranks):
        acc = None
        for mb in range(topology.micro_batches):
            micro = be.micro_batches(batch, MICRO.vocab_size)[rank][mb]
            loss, grads = forward_backward(state.params, micro, inv_n, MICRO, be)
            grads["loss"] = loss
            acc = {k: (np.zeros_like(g) if acc is None else acc[k]) + g for k, g in grads.items()}
        per_rank.append(acc)
    expected = {k: fixed_sum(np.stack([r[k] for r in per_rank]), chunk=RANK_GROUP) for k in per_rank[0]}
    loss, grads = step_gradients(state, batch, topology, be)
    assert same_bits(loss, expected.pop("loss"))
    assert all(same_bits(grads[k], expected[k]) for k in expected)
    # The order is observable: the same micro-batches as 1 rank x 20 give other bits.
    flat = batch.reshape(1, 20, 1, -1)
    _, grads_1x20 = step_gradients(state, flat, Topology(1, 20, 1), be)
    assert any(not same_bits(grads_1x20[k], grads[k]) for k in grads)


_CHILD = """
from open1b.deterministic import PRESETS, batch_for_step, builtin_dataset, init_state, require_deterministic_machine, train_step
from open1b.deterministic.backend import cpu_backend
from open1b.deterministic.selfcheck import state_fingerprint
import numba
be = cpu_backend({parallel})
require_deterministic_machine(be)
p = PRESETS["tiny"]
tokens = builtin_dataset(p.config)
prints = []
for backend in (be, cpu_backend({parallel}, fused=False)):
    s = init_state(p.config, {seed})
    for _ in range(2):
        s, _ = train_step(s, batch_for_step(tokens, {seed}, s.step, p.config, p.topology), p.topology, backend=backend)
    prints.append(state_fingerprint(s))
print(numba.config.CPU_NAME or "host", numba.config.NUMBA_NUM_THREADS, be.name, *prints)
"""


def run_child(cpu_name: str | None, threads: int, parallel: bool) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env["NUMBA_NUM_THREADS"] = str(threads)
    if cpu_name:  # numba keys cached code by CPU name and features, so targets share the cache safely
        env["NUMBA_CPU_NAME"] = cpu_name
    out = subprocess.run([sys.executable, "-c", _CHILD.format(seed=SEED, parallel=parallel)], env=env,
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_same_bits_on_generic_and_host_cpu_and_1_or_2_threads():
    # The parallel kernels on 1 and 2 threads; the x86-64 baseline target (SSE2, no FMA: ffma
    # becomes libm's fmaf) with the serial kernels, which compile in a quarter of the time.
    host1, host2 = run_child(None, 1, parallel=True), run_child(None, 2, parallel=True)
    generic = run_child("generic", 1, parallel=False)
    assert host1[:3] == ["host", "1", "cpu-parallel"] and host2[:3] == ["host", "2", "cpu-parallel"]
    assert generic[:3] == ["generic", "1", "cpu-serial"]
    # Fused epilogues (the default) and the unfused ops, on each: one fingerprint.
    assert host1[3:] == host2[3:] == generic[3:] == [state_fingerprint(run(init_state(CONFIG, SEED), 2))] * 2


def test_witness_hashing_works_in_a_forked_child_after_the_parent_hashed():
    # The witness is hashed on a per-process background thread; a child forked after the parent
    # used it must get its own thread (an inherited executor has none and would never run).
    import multiprocessing

    from open1b.deterministic.witness import replay_witness, witness_async

    grads = {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}
    expected = replay_witness(np.float32(1.5), grads, ["w"])
    assert witness_async(np.float32(1.5), grads, ["w"], F(1), F(1)).witness.result(timeout=10) == expected
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        got = pool.apply_async(_witness_in_child, (expected,)).get(timeout=30)
    assert got is True


def _witness_in_child(expected: bytes) -> bool:
    from open1b.deterministic.witness import witness_async

    grads = {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}
    return witness_async(np.float32(1.5), grads, ["w"], F(1), F(1)).witness.result(timeout=10) == expected
