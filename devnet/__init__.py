"""The test harness: a devnet of real daemon processes on one machine, with faults and
adversaries injected (``open1b-devnet``, :mod:`.cli`; docs/reliability.md).

* :mod:`.options` — what a devnet is asked to do (:class:`DevnetOptions`), the known scenarios;
* :mod:`.daemons` — the daemon processes (:class:`Daemons`): start, publish through, kill, stop;
* :mod:`.plain` — a devnet without scenarios: train, publish, cover, summarise;
* :mod:`.background` — a second devnet running as load beside the one under test;
* :mod:`.scenarios` — one module per scenario, and the driver that combines them;
* :mod:`.adversaries` — deliberately broken daemons (``--behaviour``), reaching the daemon only
  through its documented hook (:class:`open1b.node.daemon.Harness`), started by :mod:`.daemon_entry`;
* :mod:`.forged_run` — runs whose published states are forged; :mod:`.netns` — network namespaces
  (the partition); :mod:`.nat_topology` — homes behind NAT routers on shaped links, with latency
  from :mod:`.delay_line`.

Neither the daemon nor ``open1b-node`` imports anything from here (tests/test_import_graph.py).
"""

from __future__ import annotations

from .daemons import Daemons
from .options import SCENARIOS, DevnetError, DevnetOptions
from .plain import render as render_plain
from .plain import run_plain
from .scenarios import render as render_scenarios
from .scenarios import run_scenarios

__all__ = ["SCENARIOS", "Daemons", "DevnetError", "DevnetOptions", "render", "run_devnet"]


def run_devnet(opts: DevnetOptions) -> dict:
    """A devnet with ``opts.scenarios`` (each injecting its fault), or a plain one without."""
    return run_scenarios(opts) if opts.scenarios else run_plain(opts)


def render(summary: dict, opts: DevnetOptions) -> str:
    return render_scenarios(summary) if opts.scenarios else render_plain(summary)
