"""A fraud proof's verdict as coverage reads it (docs/protocol.md §8.3 step 9, §18.4): kept apart
from the referee, whose re-execution needs numpy, so that coverage stays pure Python."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Conviction:
    """What a fraud proof the referee accepted shows (docs/protocol.md §18.4), judged by the
    caller (the referee's re-execution needs numpy; coverage does not): ``guilty`` signed a trace
    of ``step`` of ``run`` from ``pre_state`` to its ``post_state`` in which one op's output does
    not follow from its inputs. ``proof``: B2 of the encoded proof, what coverage cites."""

    run: bytes
    step: int
    guilty: bytes
    pre_state: bytes
    post_state: bytes
    proof: bytes
