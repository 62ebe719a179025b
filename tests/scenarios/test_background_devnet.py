"""The second devnet that loads a machine (open1b.devnet.background; bench/reliability.py
--under-load): it really runs daemons while open, and leaves nothing behind once closed."""

from __future__ import annotations

import time

import pytest

from open1b.devnet.background import background_devnet, group_alive, leftovers

pytestmark = pytest.mark.integration

UP_TIMEOUT_S = 300.0  # it trains its run first; a loaded machine is slow


def test_the_background_devnet_runs_daemons_and_leaves_nothing_behind():
    with background_devnet(steps=4, nodes=1) as load:
        deadline = time.monotonic() + UP_TIMEOUT_S
        while not list(load.workdir.glob("devnet-*/node-*/api.addr")):  # a daemon of it is serving
            assert time.monotonic() < deadline, f"no daemon of the background devnet up within {UP_TIMEOUT_S:.0f} s"
            time.sleep(0.2)
        workdir = load.workdir
        assert load.started >= 1 and leftovers(load)  # its directory and its processes, while it runs
    assert leftovers(load) == [] and not workdir.exists()
    assert load.pgids and not any(group_alive(g) for g in load.pgids)
