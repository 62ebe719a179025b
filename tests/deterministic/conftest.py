"""Shared helpers for the engine's tests: random float32 data with full mantissas, bit comparison,
and small configurations."""

import numpy as np
import pytest

from open1b.deterministic import GPTConfig, Topology
from open1b.deterministic.backend import cpu_backend

F = np.float32

MICRO = GPTConfig(vocab_size=16, seq_len=4, d_model=8, n_layers=1, n_heads=2, d_ff=16, norm_eps=1e-5, init_std=0.5,
                  lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=1.0)  # fmt: skip
"""A model small enough for the CUDA simulator (every thread a Python thread)."""
MICRO_TOPOLOGY = Topology(ranks=2, micro_batches=1, micro_batch_size=1)


def rand(rng: np.random.Generator, *shape, scale: float = 1.0) -> np.ndarray:
    """Normal float32 values with full 24-bit mantissas, so any change of order shows in the bits."""
    return (rng.standard_normal(shape) * scale).astype(F)


def same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def micro_batch(step: int, topology: Topology = MICRO_TOPOLOGY, config: GPTConfig = MICRO) -> np.ndarray:
    shape = (topology.ranks, topology.micro_batches, topology.micro_batch_size, config.seq_len + 1)
    i = np.arange(int(np.prod(shape)))
    return ((7 * i + 3 * step) % config.vocab_size).astype(np.int32).reshape(shape)


@pytest.fixture(params=[False, True], ids=["serial", "parallel"])
def backend(request):
    """Each CPU backend in turn."""
    return cpu_backend(request.param)
