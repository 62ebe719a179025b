"""``refusing-trainer``: the run is honest, but the node that publishes it never answers a
challenge; every spot check waits out the answer deadline and fails with ``no_answer``
(docs/protocol.md §5.5), while replays verify every step."""

from __future__ import annotations

from .spot_base import SpotScenario


class RefusingTrainer(SpotScenario):
    name = "refusing-trainer"
    expected = ("no_answer",)
    what = "a publisher that never answers a challenge"
    answer_s = 3.0  # every spot check waits it out: short, so that replays are not held up for long

    def observer_args(self) -> tuple[str, ...]:
        return ("--behaviour", "refuse")
