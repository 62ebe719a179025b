"""What a command of ``open1b-node`` produces: one result, which ``cli.main`` renders in one place
(as text, or as JSON with ``--json``) before exiting with its code."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class CommandResult:
    data: Any  # JSON-able: what --json prints; None for a command that prints nothing (the daemon)
    render: Callable[[Any], str]  # the same data as text for a person
    exit_code: int = 0  # 0 success, 1 error (or a doctor FAIL), 2 mismatch / devnet incomplete

    @classmethod
    def nothing(cls) -> CommandResult:
        return cls(None, str)
