"""Turns at one resource, taken one at a time: an urgent caller goes before every ordinary one
waiting, and callers of one kind go in the order they came (the replay worker's requests,
:mod:`.worker`: a dispute's traced replays before the replays, answers and spot checks queued
ahead of them, docs/protocol.md §18.5).

A dispute has a deadline (``TRACE_TIMEOUT_S`` for each of a party's replays) and the replays
queued in front of it have none that matters as much: an hour of a `gpt-1b` auditor's queue
would otherwise come out of the dispute's. Urgent callers are few (a node takes part in at most
six disputes at once, node/dispute_exchange.py), so the ordinary ones are not starved.
"""

from __future__ import annotations

from collections import deque
from contextlib import asynccontextmanager
from typing import AsyncIterator

import trio


class Turns:
    """:meth:`turn` holds the resource; when it is let go, the first urgent waiter has it, else
    the first ordinary one (trio.Lock's fairness, with two queues)."""

    def __init__(self) -> None:
        self._held = False
        self._waiting: dict[bool, deque[trio.Event]] = {True: deque(), False: deque()}

    @property
    def waiting(self) -> int:
        return len(self._waiting[True]) + len(self._waiting[False])

    @asynccontextmanager
    async def turn(self, *, urgent: bool = False) -> AsyncIterator[None]:
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._held:
            granted = trio.Event()
            self._waiting[urgent].append(granted)
            try:
                await granted.wait()
            except BaseException:
                if granted.is_set():  # handed the turn after it was cancelled: hand it on
                    self._hand_on()
                else:
                    self._waiting[urgent].remove(granted)
                raise
        else:
            self._held = True  # before yielding: a task that runs meanwhile must wait
            await trio.lowlevel.cancel_shielded_checkpoint()
        try:
            yield
        finally:
            self._hand_on()

    def _hand_on(self) -> None:
        """The turn passes to the next waiter (still held), or the resource is free."""
        for urgent in (True, False):
            if self._waiting[urgent]:
                self._waiting[urgent].popleft().set()
                return
        self._held = False
