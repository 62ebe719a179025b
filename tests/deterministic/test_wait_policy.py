"""The parallel kernels' OpenMP threads sleep when idle (deterministic/jit.py OMP_WAIT_POLICY),
unless the operator set a policy of their own. Each case is a fresh interpreter: the policy is read
once, when numba loads its OpenMP pool."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

_CHILD = """
import json, os, time
import numba, numpy as np
from open1b.deterministic.backend import cpu_backend
be = cpu_backend(True)
a = np.ones((256, 256), np.float32)
be.matmul(a, a)
idle = []
for _ in range(9):
    be.matmul(a, a)
    t = time.process_time()
    time.sleep(0.02)
    idle.append(time.process_time() - t)
print(json.dumps({"policy": os.environ.get("OMP_WAIT_POLICY"), "layer": numba.threading_layer(),
                  "idle_cpu_s": sorted(idle)[4]}))
"""


def _child(env_policy: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if env_policy is not None:
        env["OMP_WAIT_POLICY"] = env_policy
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_an_idle_kernel_thread_sleeps_by_default():
    got = _child(None)
    assert got["policy"] == "PASSIVE"
    if got["layer"] == "omp":  # the policy is OpenMP's: numba's other layers never spin
        # While the main thread sleeps 20 ms after a parallel region, the process spends no CPU:
        # libgomp's default spins the other thread for ~7 ms of it (measured 7.5 ms).
        assert got["idle_cpu_s"] < 0.002


@pytest.mark.parametrize("policy", ["ACTIVE", "passive"])
def test_the_operators_policy_is_kept(policy):
    assert _child(policy)["policy"] == policy
