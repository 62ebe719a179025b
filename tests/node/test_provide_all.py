"""Publishing provides a run's blobs a few at a time (``provide_all``), on trio's MockClock: each
blob once, never more than ``PROVIDES_IN_FLIGHT`` walks at once, progress as each ends, and a
failed provide counted as such without stopping the others."""

import trio
from trio.testing import MockClock

from open1b.node.blobs import provider_key
from open1b.node.publisher import PROVIDES_IN_FLIGHT, provide_all


class SlowDHT:
    """A provide takes ``seconds`` and fails for the keys in ``failing``."""

    def __init__(self, seconds: float, failing: set[str]) -> None:
        self.seconds, self.failing = seconds, failing
        self.provided: list[str] = []
        self.in_flight = self.most_in_flight = 0

    async def provide(self, key: str) -> bool:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await trio.sleep(self.seconds)
        self.in_flight -= 1
        self.provided.append(key)
        return key not in self.failing


def test_every_blob_is_provided_once_a_few_at_a_time_with_progress():
    digests = [bytes([i]) * 32 for i in range(3 * PROVIDES_IN_FLIGHT + 1)]
    dht = SlowDHT(1.0, failing={provider_key(digests[5])})
    progress: list[tuple[int, bool]] = []

    async def main() -> float:
        started = trio.current_time()
        await provide_all(dht, digests, lambda done, ok: progress.append((done, ok)))
        return trio.current_time() - started

    elapsed = trio.run(main, clock=MockClock(autojump_threshold=0))
    assert sorted(dht.provided) == sorted(provider_key(d) for d in digests)
    assert dht.most_in_flight == PROVIDES_IN_FLIGHT
    assert elapsed == 4.0  # ⌈25 / 8⌉ rounds of one second, not 25 seconds one after another
    assert [done for done, _ in progress] == list(range(1, len(digests) + 1))
    assert [ok for _, ok in progress].count(False) == 1


def test_fewer_blobs_than_lanes_and_none_at_all():
    dht = SlowDHT(1.0, failing=set())
    trio.run(provide_all, dht, [b"\1" * 32, b"\2" * 32], clock=MockClock(autojump_threshold=0))
    assert dht.most_in_flight == 2 and len(dht.provided) == 2
    idle = SlowDHT(1.0, failing=set())
    trio.run(provide_all, idle, [], clock=MockClock(autojump_threshold=0))
    assert idle.provided == [] and idle.most_in_flight == 0
