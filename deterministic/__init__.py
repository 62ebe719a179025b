"""The deterministic numeric core: a tiny next-byte model whose training step gives the
same bits on every machine.

How the pieces fit:

* :mod:`.mathf` — software ``expf``/``logf`` from correctly rounded float32 ``+ - * /``;
* :mod:`.reduction` — the one fixed summation order (32-wide folds, then a pairwise tree);
* :mod:`.layers`, :mod:`.loss`, :mod:`.adamw` — numba kernels built on those two, each with
  a slow numpy reference beside it;
* :mod:`.model` — :class:`ModelConfig` (with :data:`PRESETS`), :class:`TrainState` and the
  counter-based :func:`init_state`;
* :mod:`.data` — the built-in corpus and the counter-based :func:`batch_for_step`;
* :mod:`.step` — :func:`train_step`, the single function a trainer and a replayer share;
* :mod:`.selfcheck` — probes that refuse a process that would compute other bits.

Guarantee: for equal (state, batch, config) bits, :func:`train_step` returns equal state
bits on any x86-64/ARM CPU whose process passes :func:`require_deterministic_machine`.
It does not extend to code compiled with ``fastmath`` or to a process whose FPU flags are
changed after the check.
"""

from .data import batch_for_step, corpus_digest, corpus_tokens, tokenize
from .errors import BatchFormatError, ConfigError, DeterminismError, StateFormatError
from .model import PARAM_NAMES, PRESETS, ModelConfig, TrainState, init_state
from .selfcheck import CheckResult, require_deterministic_machine, run_selfchecks
from .step import StepReport, train_step

__all__ = [
    "PARAM_NAMES",
    "PRESETS",
    "BatchFormatError",
    "CheckResult",
    "ConfigError",
    "DeterminismError",
    "ModelConfig",
    "StateFormatError",
    "StepReport",
    "TrainState",
    "batch_for_step",
    "corpus_digest",
    "corpus_tokens",
    "init_state",
    "require_deterministic_machine",
    "run_selfchecks",
    "tokenize",
    "train_step",
]
