"""Progress for long work: a rich progress bar with ETA on a terminal, plain lines otherwise
(logs and CI stay readable; a line is printed only when the count changes)."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


@contextmanager
def progress(description: str, total: int) -> Iterator[Callable[[int, str], None]]:
    """Yields ``update(done, note)``; ``note`` is extra text for the current state."""
    if sys.stderr.isatty():
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[note]}"),
                   TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
        with Progress(*columns, console=Console(stderr=True), transient=False) as bar:
            task = bar.add_task(description, total=total, note="")
            yield lambda done, note="": bar.update(task, completed=done, note=note)
        return
    last: list[tuple[int, str]] = []

    def update(done: int, note: str = "") -> None:
        if not last or last[-1] != (done, note):
            last.append((done, note))
            print(f"{description}: {done}/{total} {note}".rstrip(), file=sys.stderr, flush=True)

    yield update
