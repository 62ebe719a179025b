"""The fixed mmap threshold (deterministic/allocator.py): arrays of a megabyte or more freed
between long-lived small ones go back to the system at once. A process-wide setting, hence the
child processes."""

import subprocess
import sys

import pytest

from open1b.deterministic.allocator import return_freed_arrays_promptly

_CHILD = """
import sys
import numpy as np
from open1b.deterministic.allocator import return_freed_arrays_promptly
if sys.argv[1] == "fixed":
    assert return_freed_arrays_promptly()
def anon():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("RssAnon:")) * 1024
first = np.ones(8 << 20, np.uint8)  # freeing a mapped block raises glibc's moving threshold to its size
del first
before = anon()
big, pins = [], []
for _ in range(64):  # a step's pattern: megabyte activations, with small arrays made between them
    big.append(np.ones(2 << 20, np.uint8))
    pins.append(np.ones(16 << 10, np.uint8))  # 16 KiB: from the heap, like any small array
del big
print(anon() - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_freed_arrays_go_back_at_once_with_the_fixed_threshold():
    if not return_freed_arrays_promptly():
        pytest.skip("not glibc")
    kept = {how: int(subprocess.run([sys.executable, "-c", _CHILD, how], capture_output=True, text=True,
                                    check=True).stdout) for how in ("fixed", "default")}  # fmt: skip
    assert kept["fixed"] < 4 << 20, kept  # the small arrays stay (1 MiB of them)
    assert kept["default"] > 64 << 20, kept  # glibc's default keeps the freed heap below the pins
