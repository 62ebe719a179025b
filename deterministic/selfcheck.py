"""Start-up probes: does *this process* compute float32 the way the spec requires?

Each probe runs compiled code whose exact answer is known and differs when the process
misbehaves, on the backend being checked (the CPU, or a GPU through :mod:`.probes`' one-thread
kernel and the known-answer step on the device). They catch the failures seen in practice:

* **fusion** — ``a*b + c`` contracted into one fma (rounds once instead of twice);
* **flush-to-zero** — subnormal results replaced by zero, and **denormals-are-zero** —
  subnormal inputs read as zero (e.g. after ``torch.set_flush_denormal(True)``, or on hardware
  that flushes);
* **float64 promotion** — intermediate results computed in double precision, or kernels that
  return float64;
* **anything else** — a known-answer step: one :func:`.step.train_step` of a pinned micro model
  whose state hash is part of the spec.

:func:`require_deterministic_machine` raises :class:`.errors.DeterminismError` naming every
failed probe, so a node refuses to replay instead of publishing bits nobody can reproduce.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
from numba import njit, types

from .config import GPTConfig, Topology
from .errors import DeterminismError
from .jit import CPU_OPTIONS
from .mathf import expf, logf
from .probes import PROBE_INPUTS

_F = np.float32

KNOWN_ANSWER_CONFIG = GPTConfig(
    vocab_size=32, seq_len=8, d_model=16, n_layers=1, n_heads=2, d_ff=64, norm_eps=1e-5, init_std=0.5,
    lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=1.0,
)  # fmt: skip
KNOWN_ANSWER_TOPOLOGY = Topology(ranks=3, micro_batches=2, micro_batch_size=2)
KNOWN_ANSWER_SEED = 7
KNOWN_ANSWER_STATE = "c7df67f8a4d8acde02a76dcba4a93eb5d040ea958afd519be4d0beed4152bed5"
"""blake2b-256 (see :func:`state_fingerprint`) of the known-answer state after two steps."""


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    detail: str


@njit(**CPU_OPTIONS)
def exp_probe(x):
    return expf(x)


@njit(**CPU_OPTIONS)
def log_probe(x):
    return logf(x)


@njit(**CPU_OPTIONS)
def promotion_probe(a, b):
    # (a + b) - a: 0 in float32 for a = 1, b = 2**-30; 2**-30 if computed in float64.
    return (a + b) - a


def state_fingerprint(state) -> str:
    """blake2b-256 over the step and every state tensor's name and bytes, in :meth:`tensors` order."""
    h = hashlib.blake2b(digest_size=32)
    h.update(state.step.to_bytes(8, "little"))
    for name, a in state.tensors().items():
        h.update(name.encode() + b"\0" + np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def known_answer_batch(step: int) -> np.ndarray:
    """Step ``step``'s batch of the known-answer run: token ``(31·i + 7·step) mod 32`` at flat index i."""
    t = KNOWN_ANSWER_TOPOLOGY
    shape = (t.ranks, t.micro_batches, t.micro_batch_size, KNOWN_ANSWER_CONFIG.seq_len + 1)
    i = np.arange(int(np.prod(shape)), dtype=np.int64)
    return ((31 * i + 7 * step) % KNOWN_ANSWER_CONFIG.vocab_size).astype(np.int32).reshape(shape)


def known_answer_state(backend=None):
    """The known-answer run's state after two steps, computed here."""
    from .state import init_state
    from .step import train_step

    state = init_state(KNOWN_ANSWER_CONFIG, KNOWN_ANSWER_SEED)
    for step in range(2):
        state, _ = train_step(state, known_answer_batch(step), KNOWN_ANSWER_TOPOLOGY, backend=backend)
    return state


def _check_fusion(probed: np.ndarray) -> CheckResult:
    got = probed[0]
    detail = f"a*b+c = {float(got)!r}, expected 0.0 (fused gives 2**-24)"
    return CheckResult("no-fma-contraction", bool(got == 0), detail)


def _check_subnormals(probed: np.ndarray) -> CheckResult:
    made, read = probed[1], probed[2]  # normal inputs, subnormal result (FTZ gives 0); subnormal input (DAZ gives 0)
    ok = 0 < made < np.finfo(np.float32).smallest_normal and read == _F(2.0**-125)
    detail = f"1e-38 * 1e-3 = {float(made)!r} (expected a subnormal), 2**-149 * 2**24 = {float(read)!r}"
    return CheckResult("gradual-underflow", bool(ok), detail)


def _check_promotion(be) -> CheckResult:
    got = _F(promotion_probe(_F(1.0), _F(2.0**-30)))
    x = np.ones((2, 3), np.float32)
    dtypes = {"matmul": str(be.download(be.matmul(be.upload(x), be.upload(x), False, True)).dtype)}
    for probe in (exp_probe, log_probe):  # compiled return types (numba boxes float32 as a Python float)
        probe(_F(1.0))
        returns = {str(sig.return_type) for sig in probe.nopython_signatures if sig.args == (types.float32,)}
        dtypes[probe.__name__] = "/".join(sorted(returns))
    ok = got == 0 and all(t == "float32" for t in dtypes.values())
    detail = f"(1 + 2**-30) - 1 = {float(got)!r} (expected 0.0); dtypes {dtypes}"
    return CheckResult("float32-arithmetic", bool(ok), detail)


def _check_transcendentals(probed: np.ndarray) -> CheckResult:
    e1, l3 = (int(_F(x).view(np.uint32)) for x in probed[3:5])
    ok = e1 == 0x402DF854 and l3 == 0x3F8C9F54
    return CheckResult("expf-logf-known-answers", ok, f"expf(1) = {e1:#010x}, logf(3) = {l3:#010x}")


def _check_known_answer(backend) -> CheckResult:
    got = state_fingerprint(known_answer_state(backend))
    detail = f"state hash {got[:16]}…, expected {KNOWN_ANSWER_STATE[:16]}…"
    return CheckResult("known-answer-step", got == KNOWN_ANSWER_STATE, detail)


def run_selfchecks(backend=None) -> list[CheckResult]:
    """Run every probe and return their results (never raises on failure). ``backend``
    (default: the CPU backend of the known-answer model) is the one whose kernels the probes
    and the known-answer step run on; the float64-promotion probe also checks this thread's
    CPU code (compiled return types), which every backend's host side relies on."""
    from .backend import default_backend

    be = backend or default_backend(KNOWN_ANSWER_CONFIG)
    probed = np.asarray(be.probe(PROBE_INPUTS), np.float32)
    return [_check_fusion(probed), _check_subnormals(probed), _check_transcendentals(probed), _check_promotion(be),
            _check_known_answer(be)]  # fmt: skip


def require_deterministic_machine(backend=None) -> None:
    """Raise :class:`DeterminismError` naming every failed probe, else return None."""
    failed = [c for c in run_selfchecks(backend) if not c.ok]
    if failed:
        lines = "; ".join(f"{c.name}: {c.detail}" for c in failed)
        raise DeterminismError(f"this process cannot reproduce open1b float32 bits: {lines}")
