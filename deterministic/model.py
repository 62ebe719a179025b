"""The skeleton model, its configuration, its training state and its initialisation.

Model: ``x = E[token]``; ``h = relu(x @ W1 + b1)``; ``logits = h @ W2 + b2``; the loss is the
mean cross-entropy of the next byte over ``batch_size * seq_len`` positions.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass

import numpy as np

from .errors import ConfigError, StateFormatError

PARAM_NAMES = ("E", "W1", "b1", "W2", "b2")
"""Parameter names, in the order used everywhere a stable order matters."""


@dataclass(frozen=True)
class ModelConfig:
    """Sizes and AdamW hyper-parameters. Floats are stored as Python floats (for the
    manifest) and rounded to float32 once, by :meth:`hyper32`, where kernels use them."""

    vocab_size: int
    d_embed: int
    d_hidden: int
    batch_size: int
    seq_len: int
    lr: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type == "int":
                if type(value) is not int or value <= 0:
                    raise ConfigError(f"{f.name} must be a positive int, got {value!r}")
            elif type(value) is not float or not math.isfinite(value) or value < 0:
                raise ConfigError(f"{f.name} must be a finite float >= 0, got {value!r}")
        if not (self.beta1 < 1.0 and self.beta2 < 1.0):
            raise ConfigError("beta1 and beta2 must be < 1")
        if self.vocab_size > 256:
            raise ConfigError("the skeleton is byte-level: vocab_size must be <= 256")

    def to_dict(self) -> dict[str, int | float]:
        """Plain ints and floats keyed by field name (for a CBOR manifest)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        """Inverse of :meth:`to_dict`; raises :class:`ConfigError` on unknown or missing keys."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        missing = sorted(names - set(d))
        if unknown or missing:
            raise ConfigError(f"model config: unknown keys {unknown}, missing keys {missing}")
        return cls(**d)

    def hyper32(self) -> dict[str, np.float32]:
        """The AdamW hyper-parameters as float32 scalars (round-to-nearest from float64)."""
        return {k: np.float32(getattr(self, k)) for k in ("lr", "beta1", "beta2", "eps", "weight_decay")}

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        v, d, h = self.vocab_size, self.d_embed, self.d_hidden
        return {"E": (v, d), "W1": (d, h), "b1": (h,), "W2": (h, v), "b2": (v,)}


PRESETS: dict[str, ModelConfig] = {
    "skeleton": ModelConfig(
        vocab_size=256,
        d_embed=32,
        d_hidden=64,
        batch_size=8,
        seq_len=16,
        lr=1e-2,
        beta1=0.9,
        beta2=0.999,
        eps=1e-8,
        weight_decay=0.01,
    ),
}


def _frozen(a: np.ndarray) -> np.ndarray:
    a = np.array(a, dtype=np.float32, order="C", copy=True)
    a.flags.writeable = False
    return a


@dataclass(frozen=True, eq=False)
class TrainState:
    """Parameters, AdamW moments and step counter. Arrays are float32, C-contiguous and
    read-only: a step builds a new state and never mutates an old one."""

    params: dict[str, np.ndarray]
    m: dict[str, np.ndarray]
    v: dict[str, np.ndarray]
    step: int
    beta1_pow: np.float32
    beta2_pow: np.float32

    def tensors(self) -> dict[str, np.ndarray]:
        """Every array of the state under a stable name, in a stable order (what is hashed
        and saved): ``param/<n>``, ``adam_m/<n>``, ``adam_v/<n>`` for n in PARAM_NAMES, then
        ``adam/beta1_pow`` and ``adam/beta2_pow`` of shape (1,). The step is not a tensor."""
        out: dict[str, np.ndarray] = {}
        for prefix, group in (("param", self.params), ("adam_m", self.m), ("adam_v", self.v)):
            for name in PARAM_NAMES:
                out[f"{prefix}/{name}"] = group[name]
        out["adam/beta1_pow"] = _frozen(np.array([self.beta1_pow], np.float32))
        out["adam/beta2_pow"] = _frozen(np.array([self.beta2_pow], np.float32))
        return out

    @classmethod
    def from_tensors(cls, tensors: dict[str, np.ndarray], step: int, config: ModelConfig) -> TrainState:
        """Inverse of :meth:`tensors` (copies). Raises :class:`StateFormatError` unless the
        names, dtypes (float32) and shapes are exactly those of ``config``'s state."""
        if type(step) is not int or step < 0:
            raise StateFormatError(f"step must be a non-negative int, got {step!r}")
        shapes = config.param_shapes()
        expected = {}
        for prefix in ("param", "adam_m", "adam_v"):
            for name in PARAM_NAMES:
                expected[f"{prefix}/{name}"] = shapes[name]
        expected["adam/beta1_pow"] = (1,)
        expected["adam/beta2_pow"] = (1,)
        unknown = sorted(set(tensors) - set(expected))
        missing = sorted(set(expected) - set(tensors))
        if unknown or missing:
            raise StateFormatError(f"state tensors: unknown {unknown}, missing {missing}")
        for key, shape in expected.items():
            a = tensors[key]
            if not isinstance(a, np.ndarray) or a.dtype != np.float32:
                raise StateFormatError(f"{key}: expected a float32 array, got {getattr(a, 'dtype', type(a))}")
            if a.shape != shape:
                raise StateFormatError(f"{key}: expected shape {shape}, got {a.shape}")
        group = lambda prefix: {n: _frozen(tensors[f"{prefix}/{n}"]) for n in PARAM_NAMES}  # noqa: E731
        return cls(
            params=group("param"),
            m=group("adam_m"),
            v=group("adam_v"),
            step=step,
            beta1_pow=np.float32(tensors["adam/beta1_pow"][0]),
            beta2_pow=np.float32(tensors["adam/beta2_pow"][0]),
        )


# SplitMix64 (Steele, Lea, Flood 2014), the finaliser of java.util.SplittableRandom.
_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)

INIT_SCALES = {"E": 1.0, "W1": None, "W2": None}
"""Half-width of each drawn tensor; None means ``1/sqrt(fan_in)`` (fan_in = rows of W)."""


def uniform_init(seed: int, name: str, shape: tuple[int, ...], scale: np.float32) -> np.ndarray:
    """Counter-based uniform draw in ``[-scale, scale)``, independent of any library RNG.

    Rule (version ``open1b/init/v1``), all integers unsigned 64-bit, wrapping:

    * ``key = int.from_bytes(blake2b(b"open1b/init/v1" + seed.to_bytes(8, "little")
      + name.encode("utf-8"), digest_size=8).digest(), "little")``
    * for flat element index i (C order): ``z = key + (i + 1) * 0x9E3779B97F4A7C15``;
      ``z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9``; ``z = (z ^ (z >> 27)) * 0x94D049BB133111EB``;
      ``z = z ^ (z >> 31)`` (SplitMix64);
    * ``u = z >> 40`` (24 bits); ``r = float32(u - 2**23) * 2**-23`` in ``[-1, 1)`` (exact);
    * value ``= float32(r * scale)``: one correctly rounded float32 multiply.
    """
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed must be in [0, 2**64), got {seed}")
    digest = hashlib.blake2b(b"open1b/init/v1" + seed.to_bytes(8, "little") + name.encode("utf-8"), digest_size=8)
    key = np.uint64(int.from_bytes(digest.digest(), "little"))
    n = math.prod(shape)
    z = key + np.arange(1, n + 1, dtype=np.uint64) * _GAMMA
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    z = z ^ (z >> np.uint64(31))
    u = (z >> np.uint64(40)).astype(np.int64) - 2**23
    r = u.astype(np.float32) * np.float32(2.0**-23)
    return (r * np.float32(scale)).reshape(shape)


def init_state(config: ModelConfig, seed: int) -> TrainState:
    """Step-0 state: E, W1, W2 from :func:`uniform_init` (half-widths :data:`INIT_SCALES`,
    ``1/sqrt(fan_in)`` computed in float64 and rounded to float32), biases and moments zero,
    ``beta1_pow = beta2_pow = 1``."""
    shapes = config.param_shapes()
    params = {}
    for name in PARAM_NAMES:
        shape = shapes[name]
        if name in INIT_SCALES:
            scale = INIT_SCALES[name]
            if scale is None:
                scale = 1.0 / math.sqrt(shape[0])
            params[name] = _frozen(uniform_init(seed, name, shape, np.float32(scale)))
        else:
            params[name] = _frozen(np.zeros(shape, np.float32))
    zeros = {n: _frozen(np.zeros(shapes[n], np.float32)) for n in PARAM_NAMES}
    return TrainState(params, zeros, dict(zeros), 0, np.float32(1.0), np.float32(1.0))
