"""train_step: exact replay, save/reload, sensitivity to every input bit, CPU targets, threads."""

import hashlib
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from open1b.deterministic import (
    PRESETS,
    BatchFormatError,
    TrainState,
    batch_for_step,
    corpus_tokens,
    init_state,
    train_step,
)

CONFIG = PRESETS["skeleton"]
SEED = 11


def state_digest(state: TrainState) -> str:
    h = hashlib.blake2b(digest_size=32)
    h.update(state.step.to_bytes(8, "little"))
    for name, a in state.tensors().items():
        h.update(name.encode() + b"\0" + a.tobytes())
    return h.hexdigest()


def run(state: TrainState, steps: int) -> TrainState:
    tokens = corpus_tokens()
    for _ in range(steps):
        state, _ = train_step(state, batch_for_step(tokens, SEED, state.step, CONFIG), CONFIG)
    return state


# Test vector: pins the whole spec (init rule, data rule, kernels' order, AdamW formula).
# Changing any of them must change this, deliberately.
GOLDEN_3_STEPS = "83ae49e31b9db77929d4001c40975486c652028ce474a33e9abc73997d1f2b9a"


def test_replay_is_bit_exact_and_pinned():
    a = run(init_state(CONFIG, SEED), 3)
    b = run(init_state(CONFIG, SEED), 3)
    assert a.step == 3 and state_digest(a) == state_digest(b)
    assert state_digest(a) == GOLDEN_3_STEPS


def test_does_not_mutate_input_state():
    s0 = init_state(CONFIG, SEED)
    before = state_digest(s0)
    s1 = run(s0, 1)
    assert state_digest(s0) == before and s0.step == 0 and s1.step == 1
    assert all(not a.flags.writeable for a in s1.tensors().values())


def test_save_reload_continue_equals_uninterrupted():
    straight = run(init_state(CONFIG, SEED), 4)
    mid = run(init_state(CONFIG, SEED), 2)
    saved = {k: np.array(v) for k, v in mid.tensors().items()}  # e.g. through safetensors
    resumed = run(TrainState.from_tensors(saved, mid.step, CONFIG), 2)
    assert state_digest(resumed) == state_digest(straight)


def test_save_reload_through_safetensors(tmp_path):
    from safetensors.numpy import load_file, save_file

    mid = run(init_state(CONFIG, SEED), 1)
    save_file(mid.tensors(), str(tmp_path / "state.safetensors"))
    back = TrainState.from_tensors(load_file(str(tmp_path / "state.safetensors")), mid.step, CONFIG)
    assert state_digest(back) == state_digest(mid)


def flip_bit(a: np.ndarray, index: int, bit: int) -> np.ndarray:
    a = np.array(a)
    a.view(np.uint32 if a.dtype == np.float32 else np.int32).reshape(-1)[index] ^= 1 << bit
    return a


@pytest.mark.parametrize("key", ["param/E", "param/W1", "param/b1", "param/W2", "param/b2", "adam_m/E", "adam_m/W1",
                                 "adam_m/b1", "adam_m/W2", "adam_m/b2", "adam_v/E", "adam_v/W1", "adam_v/b1",
                                 "adam_v/W2", "adam_v/b2", "adam/beta1_pow", "adam/beta2_pow"])  # fmt: skip
def test_flipped_state_bit_changes_result(key):
    # The top mantissa bit of the largest element. Note: a step is NOT injective — flipping
    # the *lowest* bit of e.g. adam_m can be rounded away by beta1 * m + (1 - beta1) * g, so
    # a replayer must compare the hash of the input state too, not only of the output.
    s = run(init_state(CONFIG, SEED), 2)  # nonzero moments and biases
    batch = batch_for_step(corpus_tokens(), SEED, 2, CONFIG)
    tensors = {k: np.array(v) for k, v in s.tensors().items()}
    index = int(np.abs(tensors[key]).argmax())
    tensors[key] = flip_bit(tensors[key], index, 22)
    flipped = TrainState.from_tensors(tensors, s.step, CONFIG)
    assert state_digest(train_step(flipped, batch, CONFIG)[0]) != state_digest(train_step(s, batch, CONFIG)[0])


def test_lowest_bit_flip_can_be_absorbed():
    # Documents the limit stated above (if this starts failing, the note can be dropped).
    s = run(init_state(CONFIG, SEED), 2)
    batch = batch_for_step(corpus_tokens(), SEED, 2, CONFIG)
    tensors = {k: np.array(v) for k, v in s.tensors().items()}
    reference = state_digest(train_step(s, batch, CONFIG)[0])
    t = dict(tensors, **{"adam_m/W1": flip_bit(tensors["adam_m/W1"], 0, 0)})
    assert state_digest(train_step(TrainState.from_tensors(t, s.step, CONFIG), batch, CONFIG)[0]) == reference


def test_flipped_batch_token_changes_result():
    s = init_state(CONFIG, SEED)
    batch = batch_for_step(corpus_tokens(), SEED, 0, CONFIG)
    for pos in [(0, 0), (3, 7), (7, CONFIG.seq_len)]:  # an input, a middle one, a last target
        other = batch.copy()
        other[pos] ^= 1
        a, ra = train_step(s, batch, CONFIG)
        b, rb = train_step(s, other, CONFIG)
        assert state_digest(a) != state_digest(b)


def test_rejects_malformed_batch():
    s = init_state(CONFIG, SEED)
    good = batch_for_step(corpus_tokens(), SEED, 0, CONFIG)
    for bad in (good.astype(np.int64), good[:, :-1].copy(), np.full_like(good, 256), np.full_like(good, -1)):
        with pytest.raises(BatchFormatError):
            train_step(s, bad, CONFIG)


_CHILD = """
import hashlib, numba
from open1b.deterministic import PRESETS, batch_for_step, corpus_tokens, init_state, train_step, require_deterministic_machine
require_deterministic_machine()
cfg, tokens = PRESETS["skeleton"], corpus_tokens()
s = init_state(cfg, {seed})
for _ in range(3):
    s, _ = train_step(s, batch_for_step(tokens, {seed}, s.step, cfg), cfg)
h = hashlib.blake2b(digest_size=32)
h.update(s.step.to_bytes(8, "little"))
for name, a in s.tensors().items():
    h.update(name.encode() + b"\\0" + a.tobytes())
print(numba.config.CPU_NAME or "host", numba.config.NUMBA_NUM_THREADS, h.hexdigest())
"""


def run_child(cpu_name: str | None, threads: int) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env["NUMBA_NUM_THREADS"] = str(threads)
    # A separate on-disk cache per target so one target never loads the other's machine code;
    # kept between test runs (under the temp dir) so warm runs skip compilation.
    env["NUMBA_CACHE_DIR"] = os.path.join(tempfile.gettempdir(), "open1b-test-numba-cache", cpu_name or "host")
    if cpu_name:
        env["NUMBA_CPU_NAME"] = cpu_name
    out = subprocess.run([sys.executable, "-c", _CHILD.format(seed=SEED)], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_same_bits_on_generic_and_host_cpu_and_1_or_2_threads():
    host1 = run_child(None, 1)
    host2 = run_child(None, 2)
    generic = run_child("generic", 1)
    assert host1[:2] == ["host", "1"] and host2[:2] == ["host", "2"] and generic[:2] == ["generic", "1"]
    assert host1[2] == host2[2] == generic[2] == state_digest(run(init_state(CONFIG, SEED), 3))
