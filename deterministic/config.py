"""What a run trains: the model and optimiser (:class:`GPTConfig`), how each step's batch is
split (:class:`Topology`), and the named presets.

Both are frozen dataclasses of plain ints and floats so that a run manifest can carry them as
one flat map (:func:`to_manifest_model` / :func:`from_manifest_model`). Floats are kept as
Python floats and rounded to float32 once, by :meth:`GPTConfig.hyper32`, where kernels use them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from .errors import ConfigError


def _check_fields(obj) -> None:
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if f.type == "int":
            if type(value) is not int or value <= 0:
                raise ConfigError(f"{f.name} must be a positive int, got {value!r}")
        elif type(value) is not float or not math.isfinite(value) or value < 0:
            raise ConfigError(f"{f.name} must be a finite float >= 0, got {value!r}")


@dataclass(frozen=True)
class GPTConfig:
    """A decoder-only transformer and its AdamW settings.

    Architecture: learned token and position embeddings, ``n_layers`` pre-norm blocks (RMSNorm →
    causal multi-head attention → residual; RMSNorm → GELU MLP → residual), a final RMSNorm and a
    head tied to the token embedding; mean next-token cross-entropy. No biases. Positions are
    learned rather than RoPE because RoPE needs correctly rounded sin/cos tables.
    """

    vocab_size: int
    seq_len: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    norm_eps: float
    init_std: float
    lr: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    grad_clip: float

    def __post_init__(self) -> None:
        _check_fields(self)
        if self.d_model % self.n_heads:
            raise ConfigError(f"d_model {self.d_model} is not a multiple of n_heads {self.n_heads}")
        if not (self.beta1 < 1.0 and self.beta2 < 1.0):
            raise ConfigError("beta1 and beta2 must be < 1")
        if self.grad_clip <= 0.0:
            raise ConfigError("grad_clip must be > 0")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def hyper32(self) -> dict[str, np.float32]:
        """The float hyper-parameters as float32 scalars (round-to-nearest from float64)."""
        names = ("norm_eps", "lr", "beta1", "beta2", "eps", "weight_decay", "grad_clip")
        return {k: np.float32(getattr(self, k)) for k in names}

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter's shape, in the canonical parameter order (used wherever order matters)."""
        d, f = self.d_model, self.d_ff
        shapes: dict[str, tuple[int, ...]] = {"wte": (self.vocab_size, d), "wpe": (self.seq_len, d)}
        for layer in range(self.n_layers):
            shapes[f"h{layer}.ln1"] = (d,)
            shapes[f"h{layer}.attn_qkv"] = (d, 3 * d)
            shapes[f"h{layer}.attn_out"] = (d, d)
            shapes[f"h{layer}.ln2"] = (d,)
            shapes[f"h{layer}.mlp_fc"] = (d, f)
            shapes[f"h{layer}.mlp_proj"] = (f, d)
        shapes["ln_f"] = (d,)
        return shapes

    def n_params(self) -> int:
        return sum(math.prod(s) for s in self.param_shapes().values())


@dataclass(frozen=True)
class Topology:
    """How one step's batch is split: ``ranks`` data-parallel ranks × ``micro_batches`` per rank
    × ``micro_batch_size`` sequences per micro-batch. A step's batch has shape
    ``(ranks, micro_batches, micro_batch_size, seq_len + 1)``. The topology is part of the run:
    a W-rank step is replayed by one process that computes every rank's share and reduces them
    in the spec'd order (:mod:`.step`)."""

    ranks: int
    micro_batches: int
    micro_batch_size: int

    def __post_init__(self) -> None:
        _check_fields(self)

    @property
    def sequences(self) -> int:
        return self.ranks * self.micro_batches * self.micro_batch_size


@dataclass(frozen=True)
class Preset:
    config: GPTConfig
    topology: Topology


def _gpt(vocab_size, seq_len, d_model, n_layers, n_heads, lr=1e-3) -> GPTConfig:
    return GPTConfig(
        vocab_size=vocab_size, seq_len=seq_len, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
        d_ff=4 * d_model, norm_eps=1e-5, init_std=0.02, lr=lr, beta1=0.9, beta2=0.95, eps=1e-8,
        weight_decay=0.1, grad_clip=1.0,
    )  # fmt: skip


_GPT_1B = _gpt(256, 2048, 2048, 18, 16, lr=3e-4)

PRESETS: dict[str, Preset] = {
    # ~0.12M parameters: unit tests and the devnet (a step takes tens of milliseconds).
    "tiny": Preset(_gpt(256, 32, 64, 2, 4, lr=3e-3), Topology(ranks=2, micro_batches=2, micro_batch_size=2)),
    # ~10.8M parameters: benchmarks.
    "small": Preset(_gpt(256, 256, 384, 6, 6), Topology(ranks=1, micro_batches=1, micro_batch_size=4)),
    # GPT-2 small's body (d 768, 12 layers, 12 heads, context 1024) on the byte tokenizer that the
    # data path uses (bytes/v1, vocab 256): 85.9M parameters, not 124M — GPT-2's 50,257-token BPE
    # embedding is 38.6M of those, and a BPE would have to ship in the package and be committed by
    # the manifest. The name keeps the shape's usual handle. 2 ranks x 1 sequence of 1024 tokens:
    # one CPU step here takes about a minute (bench/gpt125m_devnet.py trains, publishes and audits it).
    "gpt-125m": Preset(_gpt(256, 1024, 768, 12, 12, lr=6e-4), Topology(ranks=2, micro_batches=1, micro_batch_size=1)),
    # A ~1B shape on the same byte vocabulary (0.91B parameters), at a production topology
    # (64 ranks x 4 micro-batches x 4 rows, 2M tokens a step): estimates and GPU benchmarks only.
    "gpt-1b": Preset(_GPT_1B, Topology(ranks=64, micro_batches=4, micro_batch_size=4)),
    # The same model at the topology one commodity machine trains and replays: 1 rank x 1
    # micro-batch x 1 row of 2,048 tokens, about 11 TFLOP a step (minutes on a 2-core CPU). A
    # one-process CPU step holds the parameters, the gradients and one block's activations (about
    # 9.5 bytes a parameter, ~8.6 GB); the moments stay in the checkpoints (12 bytes a parameter,
    # 11 GB each), read and written a tensor at a time (deterministic/checkpoint_stream.py).
    "gpt-1b-one-row": Preset(_GPT_1B, Topology(ranks=1, micro_batches=1, micro_batch_size=1)),
}

MANIFEST_PRESET_KEY = "preset"


def to_manifest_model(preset: str, config: GPTConfig, topology: Topology) -> dict[str, int | float | str]:
    """The manifest's ``model`` map: the preset name, every config field and the topology."""
    return {MANIFEST_PRESET_KEY: preset, **dataclasses.asdict(config), **dataclasses.asdict(topology)}


def from_manifest_model(model: dict) -> tuple[str, GPTConfig, Topology]:
    """Inverse of :func:`to_manifest_model`; :class:`ConfigError` on unknown, missing or ill-typed keys."""
    config_keys = {f.name for f in dataclasses.fields(GPTConfig)}
    topology_keys = {f.name for f in dataclasses.fields(Topology)}
    expected = config_keys | topology_keys | {MANIFEST_PRESET_KEY}
    unknown, missing = sorted(set(model) - expected), sorted(expected - set(model))
    if unknown or missing:
        raise ConfigError(f"model map: unknown keys {unknown}, missing keys {missing}")
    preset = model[MANIFEST_PRESET_KEY]
    if type(preset) is not str:
        raise ConfigError(f"preset must be a text, got {preset!r}")
    config = GPTConfig(**{k: model[k] for k in config_keys})
    return preset, config, Topology(**{k: model[k] for k in topology_keys})
