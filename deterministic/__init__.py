"""The deterministic engine: a GPT whose training step gives the same bits on every machine.

How the pieces fit:

* :mod:`.primitives` — float32 ``+ - * / sqrt``, each bound per target (Python/numpy, CPU,
  CUDA) so that nothing is ever fused into an fma; :mod:`.jit` — compile options, the engine-wide
  cache stamp and the ``device`` decorator that compiles one body for every target;
* :mod:`.reduction` — the one summation order (32-wide folds, then a pairwise tree);
  :mod:`.mathf` — software ``expf``/``logf``/``sigmoidf``;
* :mod:`.matmul`, :mod:`.norm`, :mod:`.attention`, :mod:`.activation`, :mod:`.loss`,
  :mod:`.embedding`, :mod:`.optimizer` — the kernels, each with a slow numpy reference beside it
  and a note on why it is deterministic; :mod:`.backend` binds them to the CPU (serial or
  parallel) and :mod:`.cuda` to numba-cuda;
* :mod:`.config` — :class:`GPTConfig`, :class:`Topology` and the :data:`PRESETS`;
  :mod:`.state` — :class:`TrainState` and the counter-based :func:`init_state`;
* :mod:`.gpt` — forward and backward of one micro-batch as a fixed sequence of kernels
  (each block recomputed for its backward, with the same bits);
  :mod:`.step` — :func:`train_step`, the one function a trainer and a replayer share;
* :mod:`.data` — the shipped corpus, the ``bytes/v1`` tokenizer and :func:`batch_for_step` (the
  ``open1b/data/v2`` order); :mod:`.samples` — :class:`Dataset`, its Merkle commitment and the
  samples file; :mod:`.provenance` — which samples a step used, with proofs; :mod:`.trainer`,
  :mod:`.replay`, :mod:`.runfile` — publishing and replaying runs; :mod:`.checkpoint_stream` —
  checkpoints read, hashed and written a tensor at a time, so that a step never holds two states;
* :mod:`.selfcheck` — probes that refuse a process that would compute other bits (:mod:`.probes`
  runs their arithmetic on each backend); :mod:`.device` — :func:`select_device` (``auto``,
  ``cpu``, ``cuda[:N]``): a self-checked device, its class for attestations, and the backend a
  model runs on there; :mod:`.microbatch` — a step's batch packed for one upload.

Guarantee: for equal (state, batch, topology) bits, :func:`train_step` returns equal state bits
on every backend and on any x86-64/ARM CPU or NVIDIA GPU whose process passes
:func:`require_deterministic_machine`. It does not extend to code compiled with ``fastmath``, to
a process whose FPU flags change after the check, or to steps with a non-finite loss or gradient
(which raise :class:`NonFiniteError`).
"""

import importlib

# Importing the package must stay cheap: the CLI and the daemon's trio process import light
# submodules (errors, device_spec) and must not pay for numba and the kernels (PEP 562).
_HOME = {
    "PRESETS": "config", "GPTConfig": "config", "Preset": "config", "Topology": "config",
    "batch_for_step": "data", "builtin_dataset": "data", "step_sample_indices": "data", "tokenize": "data",
    "DeviceChoice": "device", "select_device": "device",
    "BatchFormatError": "errors", "ConfigError": "errors", "DeterminismError": "errors", "DeviceError": "errors",
    "DeviceSpecError": "errors", "DeviceUnavailableError": "errors", "NonFiniteError": "errors",
    "StateFormatError": "errors",
    "Dataset": "samples", "read_samples": "samples", "write_samples": "samples",
    "CheckResult": "selfcheck", "require_deterministic_machine": "selfcheck", "run_selfchecks": "selfcheck",
    "TrainState": "state", "init_state": "state",
    "StepReport": "step", "train_step": "step",
}


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))


__all__ = [
    "PRESETS",
    "BatchFormatError",
    "CheckResult",
    "ConfigError",
    "Dataset",
    "DeterminismError",
    "DeviceChoice",
    "DeviceError",
    "DeviceSpecError",
    "DeviceUnavailableError",
    "GPTConfig",
    "NonFiniteError",
    "Preset",
    "StateFormatError",
    "StepReport",
    "Topology",
    "TrainState",
    "batch_for_step",
    "builtin_dataset",
    "init_state",
    "read_samples",
    "require_deterministic_machine",
    "run_selfchecks",
    "select_device",
    "step_sample_indices",
    "tokenize",
    "train_step",
    "write_samples",
]
