"""node/turns.py: one holder at a time, urgent callers before ordinary ones, each kind in the
order it came, and a caller cancelled while waiting (or as it is handed the turn) blocks no one."""

import random

import trio
import trio.testing

from open1b.node.turns import Turns


def test_an_urgent_caller_goes_before_the_ordinary_ones_waiting():
    order = []

    async def take(turns, name, urgent):
        async with turns.turn(urgent=urgent):
            order.append(name)

    async def main():
        turns = Turns()
        async with trio.open_nursery() as nursery:
            async with turns.turn():
                for name, urgent in (("replay 1", False), ("replay 2", False), ("trace", True), ("op data", True)):
                    nursery.start_soon(take, turns, name, urgent)
                    await trio.testing.wait_all_tasks_blocked()
                assert turns.waiting == 4
        assert order == ["trace", "op data", "replay 1", "replay 2"]
        assert turns.waiting == 0

    trio.run(main)


def test_a_cancelled_waiter_blocks_no_one():
    async def main():
        turns = Turns()
        got = []

        async def take(name, urgent, scope_out=None):
            with trio.CancelScope() as scope:
                if scope_out is not None:
                    scope_out.append(scope)
                async with turns.turn(urgent=urgent):
                    got.append(name)

        scopes = []
        async with trio.open_nursery() as nursery:
            async with turns.turn():
                nursery.start_soon(take, "gone", True, scopes)
                nursery.start_soon(take, "next", False)
                await trio.testing.wait_all_tasks_blocked()
                scopes[0].cancel()
                await trio.testing.wait_all_tasks_blocked()
                assert turns.waiting == 1
        assert got == ["next"]

        # cancelled, then handed the turn before it runs again: it hands the turn on
        async with trio.open_nursery() as nursery:
            scopes.clear()
            async with turns.turn():
                nursery.start_soon(take, "cancelled, then handed", True, scopes)
                nursery.start_soon(take, "after", False)
                await trio.testing.wait_all_tasks_blocked()
                scopes[0].cancel()  # no checkpoint until the holder lets go: still first in line
        assert got == ["next", "after"]
        async with turns.turn():  # free again
            pass

    trio.run(main)


def test_never_two_holders():
    async def main():
        turns, inside, most = Turns(), 0, 0
        rng = random.Random(7)

        async def take():
            nonlocal inside, most
            async with turns.turn(urgent=rng.random() < 0.3):
                inside += 1
                most = max(most, inside)
                await trio.sleep(0)
                inside -= 1

        async with trio.open_nursery() as nursery:
            for _ in range(200):
                nursery.start_soon(take)
        assert most == 1 and turns.waiting == 0

    trio.run(main)
