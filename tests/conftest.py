"""Suite-wide guard for the two CI lanes (``./dev test``): the unit lane runs every test *not*
marked ``integration`` and must start no daemon, so a test that starts one without the mark fails
here instead of silently slowing the lane that is meant to answer in minutes."""

from __future__ import annotations

import subprocess

import pytest


def _starts_a_daemon(args) -> bool:
    """Whether a command line runs an open1b daemon (``open1b-node daemon`` or
    ``python -m open1b.… daemon``, the harness's entry points included)."""
    if isinstance(args, (str, bytes)):
        return False  # a shell string: none of our tests start daemons that way
    words = [str(a) for a in args]
    ours = any(w.startswith("open1b.") or w.endswith("open1b-node") for w in words)
    return ours and any(w == "daemon" or w.endswith(".daemon_entry") for w in words)


@pytest.fixture(autouse=True)
def _daemons_only_in_the_integration_lane(request, monkeypatch):
    if request.node.get_closest_marker("integration") is not None:
        yield
        return
    real = subprocess.Popen

    class Guarded(real):
        def __init__(self, args, *more, **kwargs):
            if _starts_a_daemon(args):
                raise AssertionError(f"{request.node.nodeid} starts a daemon ({' '.join(map(str, args))}) "
                                     "but is not marked integration: mark it (pytest.mark.integration)")
            super().__init__(args, *more, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", Guarded)
    yield
