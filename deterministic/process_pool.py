"""A thread pool per process, made on first use (the replay witness's hashers, :mod:`.witness`)."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor


class PerProcessPool:
    """Calling it gives this process's executor. A forked child inherits its parent's executor
    without its threads (work submitted there would never run), so each process gets its own."""

    def __init__(self, max_workers: int, name: str) -> None:
        self.max_workers, self.name = max_workers, name
        self._pid: int | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def __call__(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None or self._pid != os.getpid():
                self._pid = os.getpid()
                self._pool = ThreadPoolExecutor(max_workers=self.max_workers, thread_name_prefix=self.name)
            return self._pool
