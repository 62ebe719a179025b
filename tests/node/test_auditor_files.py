"""A spot check's files are fetched at once (node/auditor.py): the fetches overlap, and a failure
reaches the spot checker as the plain RunFilesError it handles (try the step later), only after
every other fetch has finished."""

from __future__ import annotations

import pytest
import trio

from open1b.node.auditor import _all_or_first_error
from open1b.node.runs import RunFilesError


def test_fetches_overlap_and_the_first_failure_is_raised_plain_after_all_finish():
    order: list[str] = []

    async def main():
        first, second = trio.Event(), trio.Event()

        async def a():  # waits for b: fetched one after the other, this never ends
            second.set()
            await first.wait()
            order.append("a")

        async def b():
            await second.wait()
            first.set()
            order.append("b")
            raise RunFilesError("checkpoint 4: no provider")

        async def c():
            await trio.sleep(0.2)
            order.append("c")
            raise RunFilesError("fingerprints: no provider")

        with trio.fail_after(10):
            await _all_or_first_error([a, b, c])

    with pytest.raises(RunFilesError, match="checkpoint 4"):  # not an ExceptionGroup
        trio.run(main)
    assert sorted(order) == ["a", "b", "c"]
