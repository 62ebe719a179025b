"""How the suite is spread over pytest-xdist's workers (``-n 2 --dist loadgroup``, pyproject).

Each test file runs whole on one worker, so a module's expensive fixtures (a devnet shared by
several tests) are built once. Tests marked ``netns`` share one group: every network partition
uses the same host addresses (node/devnet/netns.py), so two must never run at once.
"""

import pytest


def pytest_collection_modifyitems(config, items):
    for item in items:
        group = "netns" if item.get_closest_marker("netns") else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))
