"""A pool of device memory for :class:`.cuda.CudaBackend`: a replayed step allocates nothing new.

numba-cuda allocates every device array with ``cuMemAlloc`` and frees it, batched, when the last
view of it is gone: a `small` step made ~650 allocation/free pairs. The pool keeps every block it
ever allocated. A backend array is a *lease* over a block: when numba would free it (the last
array or view over it is gone), the block goes back to the pool's free list for its size, and the
next request of that size gets it. A step repeats the same requests, so from the second step on
nothing is allocated (``allocations`` stops growing; the tests count it under the simulator).

Why reuse is safe: every kernel and copy of the backend runs on the one default stream, in the
order issued. A block given back while a queued kernel still reads it is only written by work
queued after that kernel (the single-stream rule of caching allocators). Nothing here changes a
value: a lease's contents are undefined until written, as ``cuda.device_array``'s are.

Blocks are reused only at their exact (rounded) size, so the pool's footprint (``pooled_bytes``)
is the sum over sizes of the most leases of that size alive at once: above the live peak when
sizes vary, equal to it for a step whose requests repeat. :meth:`DevicePool.clear` gives the free
blocks back to numba (e.g. before a different model).

Leases: on a GPU, numba's own reference counting of device memory decides when a lease ends
(an ``AutoFreePointer`` over the block, whose "free" returns it here); under the simulator, where
a device array is a numpy array, a lease is a small object that every numpy view of it keeps
alive as its ``base``.
"""

from __future__ import annotations

import math
import weakref
from typing import Callable

import numpy as np

GRANULE = 512
"""Bytes a request is rounded up to (requests of nearby sizes share blocks)."""


def block_size(nbytes: int) -> int:
    return max(1, math.ceil(nbytes / GRANULE)) * GRANULE


class DevicePool:
    """Free device blocks by size; ``allocate(nbytes)`` makes a new block (a device array of
    bytes) when none is free, ``lease(block, shape, dtype, give_back)`` wraps one as an array."""

    def __init__(self, allocate: Callable, lease: Callable) -> None:
        self._allocate, self._lease = allocate, lease
        self._free: dict[int, list] = {}
        self.allocations = 0
        """Blocks allocated from the device: stops growing once every step's requests repeat."""
        self.reuses = 0
        self.pooled_bytes = 0
        """Device bytes the pool holds, leased or free."""

    def array(self, shape: tuple[int, ...], dtype):
        """A device array of ``shape`` and ``dtype`` (contents undefined) over a pooled block."""
        size = block_size(math.prod(shape) * np.dtype(dtype).itemsize)
        free = self._free.get(size)
        if free:
            block = free.pop()
            self.reuses += 1
        else:
            block = self._allocate(size)
            self.allocations += 1
            self.pooled_bytes += size
        # A finaliser may run on any thread (a garbage collection, a simulator thread): giving back
        # is one list append, atomic under the GIL, and take-side counters are only touched here.
        return self._lease(block, shape, dtype, lambda: self._free.setdefault(size, []).append(block))

    def clear(self) -> int:
        """Drop every free block (numba frees them); returns the bytes dropped."""
        dropped = sum(b.nbytes for blocks in self._free.values() for b in blocks)
        self._free = {}
        self.pooled_bytes -= dropped
        return dropped


def gpu_lease(block, shape, dtype, give_back):
    """A ``DeviceNDArray`` over ``block`` whose memory, once no array or view holds it, calls
    ``give_back`` instead of being freed: numba's ``AutoFreePointer`` counts the views (each holds
    an ``OwnedPointer``) and calls its finaliser at zero, which also drops the pointer kept here."""
    from numba.cuda.cudadrv.devicearray import DeviceNDArray
    from numba.cuda.cudadrv.driver import AutoFreePointer

    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    key = object()

    def release():
        _LEASED.pop(key, None)
        give_back()

    root = AutoFreePointer(block.gpu_data.context, block.gpu_data.device_pointer, nbytes, finalizer=release)
    _LEASED[key] = root  # numba's own allocations are kept alive by its context the same way
    itemsize = np.dtype(dtype).itemsize
    strides = tuple(itemsize * math.prod(shape[i + 1:]) for i in range(len(shape)))  # C order
    return DeviceNDArray(shape, strides, np.dtype(dtype), gpu_data=root.own())


_LEASED: dict[object, object] = {}


class _SimLease:
    """A numpy-array exporter whose lifetime is that of every view of it (their common ``base``)."""

    __slots__ = ("__array_interface__", "block", "__weakref__")


def sim_lease(block, shape, dtype, give_back):
    """Under the simulator: a ``FakeCUDAArray`` over ``block`` (a numpy byte array); ``give_back``
    runs when the last numpy view of it is gone."""
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    lease = _SimLease()
    lease.block = block
    lease.__array_interface__ = {"shape": tuple(shape), "typestr": np.dtype(dtype).str, "version": 3,
                                 "data": (block.__array_interface__["data"][0], False)}  # fmt: skip
    weakref.finalize(lease, give_back)
    return FakeCUDAArray(np.asarray(lease))
