"""Configs and presets, the manifest's model map, TrainState round trip and validation, the init rule."""

import dataclasses
import hashlib

import numpy as np
import pytest

from open1b.deterministic import PRESETS, ConfigError, GPTConfig, StateFormatError, Topology, TrainState, init_state
from open1b.deterministic.config import from_manifest_model, to_manifest_model
from open1b.deterministic.state import init_scale, uniform_init

CONFIG, TOPOLOGY = PRESETS["tiny"].config, PRESETS["tiny"].topology


def test_presets_have_the_sizes_they_promise():
    sizes = {name: p.config.n_params() for name, p in PRESETS.items()}
    assert 90_000 <= sizes["tiny"] <= 150_000
    assert 9_000_000 <= sizes["small"] <= 12_000_000
    assert sizes["gpt-125m"] == 85_936_896  # GPT-2 small's body on a 256-byte vocabulary
    assert 0.9e9 <= sizes["gpt-1b"] <= 0.92e9
    assert PRESETS["gpt-1b-one-row"].config == PRESETS["gpt-1b"].config  # the same model, one row a step
    assert PRESETS["gpt-1b-one-row"].topology.sequences == 1
    assert {p.config.vocab_size for p in PRESETS.values()} == {256}  # the byte tokenizer's, for every preset
    shapes = CONFIG.param_shapes()
    assert list(shapes)[:2] == ["wte", "wpe"] and list(shapes)[-1] == "ln_f"
    assert shapes["h1.attn_qkv"] == (64, 192) and shapes["h0.mlp_proj"] == (256, 64)


def test_manifest_model_map_round_trip():
    model = to_manifest_model("tiny", CONFIG, TOPOLOGY)
    assert model["preset"] == "tiny" and model["ranks"] == 2 and model["micro_batches"] == 2
    assert all(type(v) in (int, float, str) for v in model.values()) and len(model) <= 64  # protocol limit
    assert from_manifest_model(model) == ("tiny", CONFIG, TOPOLOGY)


@pytest.mark.parametrize("change", [{"extra": 1}, {"lr": None}, {"vocab_size": 256.0}, {"d_model": True},
                                    {"beta1": 1.0}, {"eps": float("nan")}, {"n_heads": 3}, {"ranks": 0},
                                    {"grad_clip": 0.0}, {"preset": 7}])  # fmt: skip
def test_model_map_rejects_bad_values(change):
    model = to_manifest_model("tiny", CONFIG, TOPOLOGY)
    model.update(change)
    if change.get("lr", 0) is None:
        del model["lr"]
    with pytest.raises(ConfigError):
        from_manifest_model(model)


def test_configs_are_frozen_and_typed():
    with pytest.raises(dataclasses.FrozenInstanceError):
        CONFIG.lr = 1.0  # type: ignore[misc]
    assert TOPOLOGY.sequences == 8 and CONFIG.head_dim == 16
    with pytest.raises(ConfigError):
        Topology(ranks=1, micro_batches=1, micro_batch_size=-1)
    with pytest.raises(ConfigError):
        GPTConfig(**{**dataclasses.asdict(CONFIG), "seq_len": 0})


def test_state_tensor_names_and_round_trip():
    s = init_state(CONFIG, 5)
    t = s.tensors()
    n = len(CONFIG.param_shapes())
    assert list(t)[:2] == ["param/wte", "param/wpe"] and list(t)[n] == "adam_m/wte"
    assert list(t)[-2:] == ["adam/beta1_pow", "adam/beta2_pow"] and len(t) == 3 * n + 2
    assert all(a.dtype == np.float32 and a.flags.c_contiguous for a in t.values())
    back = TrainState.from_tensors(t, 0, CONFIG)
    assert all(np.array_equal(back.tensors()[k], t[k]) for k in t)
    assert type(back.beta1_pow) is np.float32 and back.config == CONFIG


@pytest.mark.parametrize("damage", ["missing", "unknown", "dtype", "shape", "step"])
def test_from_tensors_rejects_damage(damage):
    t = dict(init_state(CONFIG, 5).tensors())
    step = 0
    if damage == "missing":
        del t["adam_v/h0.ln1"]
    elif damage == "unknown":
        t["param/h9.ln1"] = t["param/h0.ln1"]
    elif damage == "dtype":
        t["param/h0.mlp_fc"] = t["param/h0.mlp_fc"].astype(np.float64)
    elif damage == "shape":
        t["param/ln_f"] = t["param/ln_f"][:-1]
    else:
        step = -1
    with pytest.raises(StateFormatError):
        TrainState.from_tensors(t, step, CONFIG)


def _splitmix_scalar(seed: int, name: str, i: int, scale: np.float32) -> np.float32:
    # Independent scalar implementation of the documented rule with Python ints.
    mask = 2**64 - 1
    key = int.from_bytes(hashlib.blake2b(b"open1b/init/v1" + seed.to_bytes(8, "little") + name.encode(), digest_size=8).digest(), "little")
    z = (key + (i + 1) * 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    z = z ^ (z >> 31)
    r = np.float32((z >> 40) - 2**23) * np.float32(2.0**-23)
    return np.float32(r * scale)


def test_init_follows_documented_rule():
    scale = np.float32(0.125)
    got = uniform_init(2**64 - 1, "h0.attn_qkv", (7, 9), scale).reshape(-1)
    ref = np.array([_splitmix_scalar(2**64 - 1, "h0.attn_qkv", i, scale) for i in range(63)], np.float32)
    assert got.tobytes() == ref.tobytes()
    assert np.all(np.abs(got) <= scale)


def test_init_scales_and_determinism():
    a, b, c = init_state(CONFIG, 1), init_state(CONFIG, 1), init_state(CONFIG, 2)
    assert all(a.tensors()[k].tobytes() == b.tensors()[k].tobytes() for k in a.tensors())
    assert a.params["wte"].tobytes() != c.params["wte"].tobytes()
    assert (a.params["h0.ln1"] == 1).all() and not a.m["wte"].any() and a.beta1_pow == 1
    # uniform with half-width std·√3 has deviation std; the residual projections get std/√(2L)
    assert init_scale(CONFIG, "wte") == np.float32(0.02 * 3**0.5)
    assert init_scale(CONFIG, "h1.mlp_proj") == np.float32(0.02 / 2 * 3**0.5)
    assert abs(float(a.params["h0.mlp_fc"].std()) - 0.02) < 0.001
    # Pinned elements (a test vector for other implementations).
    assert init_state(CONFIG, 0).params["wte"].reshape(-1)[:2].view(np.uint32).tolist() == [1019575145, 1017954580]
