"""``python -m open1b.devnet.daemon_entry --behaviour NAME[=ARG] DAEMON_ARGS``: an ``open1b-node
daemon DAEMON_ARGS`` that misbehaves on purpose (:mod:`.adversaries`), for devnet scenarios only.

The one way an adversary reaches a daemon: this entry point hands it to the daemon's documented
hook (:class:`open1b.node.daemon.Harness`). ``open1b-node`` itself has no such flag and imports
nothing of the harness; a devnet's honest nodes run ``open1b-node daemon`` unchanged.
"""

from __future__ import annotations

import argparse
import sys

from open1b.node import cli

from .adversaries import from_name


def main(argv: list[str] | None = None) -> int:
    own = argparse.ArgumentParser(prog="python -m open1b.devnet.daemon_entry", allow_abbrev=False,
                                  description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    own.add_argument("--behaviour", required=True, metavar="NAME[=ARG]", help="the adversary (devnet/adversaries.py)")
    ours, daemon_args = own.parse_known_args(argv)
    args = cli.parser().parse_args(["daemon", *daemon_args])
    # logging is set up (by daemon_config) before the adversary announces itself
    return cli.run_command(args, lambda a: cli.serve_daemon(cli.daemon_config(a), harness=from_name(ours.behaviour)),
                           prog="open1b.devnet.daemon_entry")


if __name__ == "__main__":
    sys.exit(main())
