"""``forged-microbatch``: one micro-batch's gradient is forged and every commitment is consistent
with it; a challenge of that slot recomputes it (``gradient``), and any challenge's chunks sum to
a committed sum that the forged gradient changed (``sum``) — docs/run-format.md §10.3."""

from __future__ import annotations

from .spot_base import SpotScenario


class ForgedMicrobatch(SpotScenario):
    name = "forged-microbatch"
    forgery = "forged-microbatch"
    expected = ("gradient", "sum", "proof", "update")
    what = "a step with one forged micro-batch gradient"
    at = 0.75
