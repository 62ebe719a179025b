"""How a process that replays or trains gets the memory of its freed arrays back at once.

glibc's malloc serves a request of at least its mmap threshold with a mapping of its own, which
``free`` unmaps; anything smaller comes from a heap that gives back only what lies at its top.
The threshold starts at 128 KiB but rises to the size of each mapped block freed (up to 32 MiB),
so after the first activations of a step are freed, the next ones (megabytes: a block's inputs,
its products) come from the heap, and a parameter allocated between them pins the heap's top:
a ``gpt-125m`` replay held ~130 MB free but unreturned at its peak and ~480 MB after it, in a
worker process that lives on (tracemalloc-free accounting from ``mallinfo2``; issue 29). A fixed
threshold keeps every array of a megabyte or more in a mapping of its own, returned when freed.
It changes where arrays live, never their bits.
"""

from __future__ import annotations

import ctypes

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number (malloc.h)
MMAP_THRESHOLD = 1 << 20
"""Arrays from this size up get a mapping of their own: every activation and parameter of a model
worth measuring, while the interpreter's small objects stay on the heap."""


def return_freed_arrays_promptly() -> bool:
    """Fix glibc's mmap threshold at :data:`MMAP_THRESHOLD` for this process; False where the C
    library is not glibc (nothing to set: other allocators keep no such moving threshold)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
