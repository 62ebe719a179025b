"""``forged-data``: the trainer commits step k's batch but trains on other text, with fingerprints
of what it trained on; the recomputed micro-batch's loss gives it away (docs/run-format.md §10.3)."""

from __future__ import annotations

from .spot_base import SpotScenario


class ForgedData(SpotScenario):
    name = "forged-data"
    forgery = "forged-data"
    expected = ("loss", "gradient")
    what = "a step trained on other text than its committed batch"
