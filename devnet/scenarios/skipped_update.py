"""``skipped-update``: checkpoint k+1 is not AdamW of the committed gradient sum; the chunks'
update check gives it away (docs/run-format.md §10.3)."""

from __future__ import annotations

from .spot_base import SpotScenario


class SkippedUpdate(SpotScenario):
    name = "skipped-update"
    forgery = "skipped-update"
    expected = ("update",)
    what = "a step whose update was skipped"
    at = 0.25
