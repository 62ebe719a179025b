"""How this package compiles its kernels: one set of options, one cache rule, one decorator
for code shared by every target.

* :data:`CPU_OPTIONS` — every CPU kernel is compiled with ``error_model='numpy'`` (1/0 gives
  inf, as on a GPU), ``nogil`` and the on-disk cache, and never with ``fastmath`` (which would
  let LLVM contract ``a*b + c`` into an fma or reassociate sums).
* :func:`device` — marks a plain Python function as *device code*: run as Python it is the
  numpy-float32 emulation of itself; called from a CPU kernel it is compiled for the CPU, and
  from a CUDA kernel for CUDA (:mod:`.cuda` registers it there). The body is written once.
* :func:`cpu_kernels` — builds the serial and the parallel (``prange``) variants of a family
  of CPU kernels from one source.
* The OpenMP threads of the parallel kernels sleep when idle (:data:`OMP_WAIT_POLICY`) unless the
  operator says otherwise.
* The on-disk cache is stamped with a digest of *every* source file of this package. Numba's
  own stamp covers only the file that holds the kernel; a kernel that inlines device code from
  another module (``expf`` from :mod:`.mathf`, say) would otherwise load stale machine code
  after an upgrade and compute other bits.

SLP vectorisation is switched on: it packs independent scalar operations into SIMD lanes
(the register-tiled matmul depends on it) and never reorders a dependent chain, so it does not
change any result.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Callable

import numba
from numba import prange
from numba.core import caching
from numba.extending import overload

numba.config.SLP_VECTORIZE = 1

OMP_WAIT_POLICY = "PASSIVE"
"""Set for this process (unless set already) before numba loads its OpenMP pool
(at the first parallel kernel), which reads it then.
libgomp's default spins an idle thread for ~7 ms after every parallel region: the step's serial
Python between kernels (and a trace's hashing) ran beside a core burning its time, and a machine
doing anything else lost that core. Measured on 2 cores (docs/benchmarks.md, "The kernels' wait
policy"): a ``small`` replay 15 % less CPU and 7 % less wall, a ``gpt-125m`` one 26 % less CPU and
27 % less wall. The bits are the static schedule's either way."""
os.environ.setdefault("OMP_WAIT_POLICY", OMP_WAIT_POLICY)

CPU_OPTIONS = {"cache": True, "error_model": "numpy", "nogil": True}

_PACKAGE_DIR = Path(__file__).resolve().parent


def _source_digest() -> str:
    h = hashlib.blake2b(digest_size=16)
    for path in sorted(_PACKAGE_DIR.rglob("*.py")):
        h.update(path.relative_to(_PACKAGE_DIR).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


SOURCE_DIGEST = _source_digest()
"""Digest of every ``.py`` file of this package: the stamp of every cached kernel."""


class _EngineStamp:
    """Mixin for numba cache locators: stamp entries with :data:`SOURCE_DIGEST`."""

    def get_source_stamp(self):
        return SOURCE_DIGEST

    @classmethod
    def from_function(cls, py_func, py_file):
        if not Path(py_file).resolve().is_relative_to(_PACKAGE_DIR):
            return None
        return super().from_function(py_func, py_file)


class _EngineUserDirLocator(_EngineStamp, caching.UserProvidedCacheLocator):
    """``$NUMBA_CACHE_DIR`` when set (numba's own precedence)."""


class _EngineInTreeLocator(_EngineStamp, caching.InTreeCacheLocator):
    """Otherwise ``deterministic/__pycache__``, shared by every process of this install."""


class _EngineUserWideLocator(_EngineStamp, caching.UserWideCacheLocator):
    """Or, where the package directory is read-only, numba's per-user cache directory."""


for _locator in (_EngineUserWideLocator, _EngineInTreeLocator, _EngineUserDirLocator):  # each goes first
    if _locator not in caching.CacheImpl._locator_classes:
        caching.CacheImpl._locator_classes.insert(0, _locator)

DEVICE_FUNCTIONS: list[Callable] = []
"""Every :func:`device` function, in definition order (the CUDA target registers them all)."""


def device(fn: Callable) -> Callable:
    """Register ``fn`` as device code (see module doc) and return it unchanged."""
    overload(fn, target="cpu", jit_options=CPU_OPTIONS, strict=False)(lambda *args: fn)
    DEVICE_FUNCTIONS.append(fn)
    return fn


def cpu_kernels(build: Callable[[Callable, bool], object]) -> dict[bool, object]:
    """``{False: serial, True: parallel}`` from ``build(rows, parallel)``.

    ``build`` defines its kernels with ``@numba.njit(parallel=parallel, **CPU_OPTIONS)`` and
    loops over independent outputs with ``for i in rows(n)``; ``rows`` is ``range`` or
    ``prange``. Because ``rows`` is a closure variable, the two variants get different cache
    keys (numba keys closures by their cell contents, not by their compile flags).
    """
    return {False: build(range, False), True: build(prange, True)}
