"""ModelConfig round trip and validation; TrainState tensors round trip and validation; init rule."""

import hashlib

import numpy as np
import pytest

from open1b.deterministic import PRESETS, ConfigError, ModelConfig, StateFormatError, TrainState, init_state
from open1b.deterministic.model import uniform_init

CONFIG = PRESETS["skeleton"]


def test_config_dict_round_trip_plain_types():
    d = CONFIG.to_dict()
    assert all(type(v) in (int, float) for v in d.values())
    assert ModelConfig.from_dict(d) == CONFIG


@pytest.mark.parametrize("change", [{"extra": 1}, {"lr": None}, {"vocab_size": 256.0}, {"d_embed": True},
                                    {"beta1": 1.0}, {"eps": float("nan")}, {"vocab_size": 300}])  # fmt: skip
def test_config_rejects_bad_dicts(change):
    d = CONFIG.to_dict()
    d.update(change)
    if change.get("lr", 0) is None:
        del d["lr"]
    with pytest.raises(ConfigError):
        ModelConfig.from_dict(d)


def test_state_tensor_names_and_round_trip():
    s = init_state(CONFIG, 5)
    t = s.tensors()
    assert list(t)[:5] == ["param/E", "param/W1", "param/b1", "param/W2", "param/b2"]
    assert list(t)[-2:] == ["adam/beta1_pow", "adam/beta2_pow"] and len(t) == 17
    assert all(a.dtype == np.float32 and a.flags.c_contiguous for a in t.values())
    back = TrainState.from_tensors(t, 0, CONFIG)
    assert all(np.array_equal(back.tensors()[k], t[k]) for k in t)
    assert type(back.beta1_pow) is np.float32


@pytest.mark.parametrize("damage", ["missing", "unknown", "dtype", "shape", "step"])
def test_from_tensors_rejects_damage(damage):
    t = dict(init_state(CONFIG, 5).tensors())
    step = 0
    if damage == "missing":
        del t["adam_v/b1"]
    elif damage == "unknown":
        t["param/W3"] = t["param/W2"]
    elif damage == "dtype":
        t["param/W1"] = t["param/W1"].astype(np.float64)
    elif damage == "shape":
        t["param/b2"] = t["param/b2"][:-1]
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
    got = uniform_init(2**64 - 1, "W1", (7, 9), scale).reshape(-1)
    ref = np.array([_splitmix_scalar(2**64 - 1, "W1", i, scale) for i in range(63)], np.float32)
    assert got.tobytes() == ref.tobytes()
    assert np.all(np.abs(got) <= scale)


def test_init_is_deterministic_and_seed_and_name_dependent():
    a, b, c = init_state(CONFIG, 1), init_state(CONFIG, 1), init_state(CONFIG, 2)
    assert all(a.tensors()[k].tobytes() == b.tensors()[k].tobytes() for k in a.tensors())
    assert a.params["E"].tobytes() != c.params["E"].tobytes()
    assert a.params["W1"][:4].tobytes() != a.params["W2"][:4].tobytes()
    assert not a.params["b1"].any() and not a.m["E"].any() and a.beta1_pow == 1
    # Pinned element (test vector for other implementations).
    assert init_state(CONFIG, 0).params["E"].reshape(-1)[:4].view(np.uint32).tolist() == [
        3205017924, 1064249648, 3209837152, 1056541120]  # fmt: skip
