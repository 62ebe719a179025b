"""The training state (parameters, AdamW moments, step counter) and its counter-based initialisation."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np

from .config import GPTConfig
from .errors import StateFormatError


def frozen(a: np.ndarray) -> np.ndarray:
    """A read-only, C-contiguous float32 copy."""
    a = np.array(a, dtype=np.float32, order="C", copy=True)
    a.flags.writeable = False
    return a


@dataclass(frozen=True, eq=False)
class TrainState:
    """Parameters, AdamW moments and step counter of ``config``'s model. Arrays are float32,
    C-contiguous and read-only: a step builds a new state and never mutates an old one."""

    config: GPTConfig
    params: dict[str, np.ndarray]
    m: dict[str, np.ndarray]
    v: dict[str, np.ndarray]
    step: int
    beta1_pow: np.float32
    beta2_pow: np.float32

    def tensors(self) -> dict[str, np.ndarray]:
        """Every array of the state under a stable name (what is hashed and saved):
        ``param/<n>``, ``adam_m/<n>``, ``adam_v/<n>`` for n in parameter order, then
        ``adam/beta1_pow`` and ``adam/beta2_pow`` of shape (1,). The step is not a tensor."""
        out: dict[str, np.ndarray] = {}
        for prefix, group in (("param", self.params), ("adam_m", self.m), ("adam_v", self.v)):
            for name in self.config.param_shapes():
                out[f"{prefix}/{name}"] = group[name]
        out["adam/beta1_pow"] = frozen(np.array([self.beta1_pow], np.float32))
        out["adam/beta2_pow"] = frozen(np.array([self.beta2_pow], np.float32))
        return out

    @classmethod
    def from_tensors(cls, tensors: dict[str, np.ndarray], step: int, config: GPTConfig) -> TrainState:
        """Inverse of :meth:`tensors` (copies). Raises :class:`StateFormatError` unless the
        names, dtypes (float32) and shapes are exactly those of ``config``'s state."""
        if type(step) is not int or step < 0:
            raise StateFormatError(f"step must be a non-negative int, got {step!r}")
        shapes = config.param_shapes()
        expected = {f"{prefix}/{n}": s for prefix in ("param", "adam_m", "adam_v") for n, s in shapes.items()}
        expected["adam/beta1_pow"] = expected["adam/beta2_pow"] = (1,)
        unknown, missing = sorted(set(tensors) - set(expected)), sorted(set(expected) - set(tensors))
        if unknown or missing:
            raise StateFormatError(f"state tensors: unknown {unknown}, missing {missing}")
        for key, shape in expected.items():
            a = tensors[key]
            if not isinstance(a, np.ndarray) or a.dtype != np.float32:
                raise StateFormatError(f"{key}: expected a float32 array, got {getattr(a, 'dtype', type(a))}")
            if a.shape != shape:
                raise StateFormatError(f"{key}: expected shape {shape}, got {a.shape}")
        group = lambda prefix: {n: frozen(tensors[f"{prefix}/{n}"]) for n in shapes}  # noqa: E731
        return cls(config, group("param"), group("adam_m"), group("adam_v"), step,
                   np.float32(tensors["adam/beta1_pow"][0]), np.float32(tensors["adam/beta2_pow"][0]))  # fmt: skip


# SplitMix64 (Steele, Lea, Flood 2014), the finaliser of java.util.SplittableRandom.
_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


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


def init_scale(config: GPTConfig, name: str) -> np.float32 | None:
    """Half-width of parameter ``name``'s uniform draw, or None for a gain (initialised to 1).

    Standard deviation ``init_std`` (``init_std / sqrt(2·n_layers)`` for the two projections
    that write into the residual stream, as GPT-2); a uniform draw of half-width ``std·√3`` has
    that deviation. Computed in float64, rounded to float32 once.
    """
    if name == "ln_f" or name.endswith((".ln1", ".ln2")):
        return None
    std = config.init_std
    if name.endswith((".attn_out", ".mlp_proj")):
        std /= math.sqrt(2 * config.n_layers)
    return np.float32(std * math.sqrt(3.0))


def init_param(config: GPTConfig, seed: int, name: str) -> np.ndarray:
    """Parameter ``name`` of the step-0 state (read-only): a matrix from :func:`uniform_init`
    (half-width :func:`init_scale`), or a gain of ones."""
    shape, scale = config.param_shapes()[name], init_scale(config, name)
    return frozen(np.ones(shape, np.float32) if scale is None else uniform_init(seed, name, shape, scale))


def init_state(config: GPTConfig, seed: int) -> TrainState:
    """Step-0 state: every parameter :func:`init_param`, moments zero, ``beta1_pow = beta2_pow = 1``."""
    params = {name: init_param(config, seed, name) for name in config.param_shapes()}
    zeros = {n: frozen(np.zeros(s, np.float32)) for n, s in config.param_shapes().items()}
    return TrainState(config, params, zeros, dict(zeros), 0, np.float32(1.0), np.float32(1.0))
