"""``refusing-trainer``: the run is honest, but the node that publishes it never answers a
challenge; every spot check waits out the answer deadline and fails with ``no_answer``
(docs/protocol.md §5.5), while replays verify every step."""

from __future__ import annotations

from .spot_base import SpotScenario


class RefusingTrainer(SpotScenario):
    name = "refusing-trainer"
    expected = ("no_answer",)
    what = "a publisher that never answers a challenge"

    def observer_args(self) -> tuple[str, ...]:
        return ("--behaviour", "refuse")
