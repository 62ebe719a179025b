"""The states of a publish job, as the daemon keeps them and the API shows them (``/v1/publications``)."""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    CHECKING = "checking"  # every file read and checked against the manifest, imported into the cache
    PROVIDING = "providing"  # each blob announced in the DHT
    ANNOUNCING = "announcing"  # the manifest gossiped on the runs topic
    DONE = "done"
    FAILED = "failed"

    @property
    def finished(self) -> bool:
        return self in (JobState.DONE, JobState.FAILED)
