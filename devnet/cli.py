"""``open1b-devnet`` (also ``python -m open1b.devnet``, ``open1b-node devnet`` and ``./dev devnet``):
train a run and audit it with a local network of daemons, with faults and adversaries injected on
request. Exit codes: 0 complete (with scenarios: every check held), 1 error, 2 not complete before
the deadline (a scenario's check failed)."""

from __future__ import annotations

import argparse
from pathlib import Path

from open1b.node.cli import DEVICE_HELP, run_command
from open1b.node.results import CommandResult

from .options import SCENARIOS

PROG = "open1b-devnet"


def cmd_devnet(args: argparse.Namespace) -> CommandResult:
    from . import DevnetOptions, render, run_devnet

    opts = DevnetOptions(nodes=args.nodes, steps=args.steps, redundancy=args.redundancy, tamper_step=args.tamper_step,
                         eval_every=args.eval_every, tamper_eval=args.tamper_eval, deadline_s=args.deadline,
                         seed=args.seed, workdir=Path(args.workdir) if args.workdir else None, keep=args.keep,
                         scenarios=tuple(dict.fromkeys(args.scenario)), device=args.device,
                         **({"preset": args.preset} if args.preset else {}))
    summary = run_devnet(opts)
    return CommandResult(summary, lambda result: render(result, opts),
                         0 if summary["ok" if opts.scenarios else "complete"] else 2)


def parser() -> argparse.ArgumentParser:
    n = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    n.add_argument("--json", action="store_true", help="machine-readable output")
    n.add_argument("--nodes", type=int, default=3, help="auditor daemons (an observer is added)")
    n.add_argument("--steps", type=int, default=8)
    n.add_argument("--preset", help="model preset (default: the engine's default; not with --scenario)")
    n.add_argument("--redundancy", type=int, default=1)
    n.add_argument("--tamper-step", type=int, help="forge the published state after this step")
    n.add_argument("--eval-every", type=int, default=0, metavar="V",
                   help="commit a held-out evaluation set and evaluate every V-th state (0: no evaluation)")
    n.add_argument("--tamper-eval", type=int, metavar="K", help="the trainer publishes a false loss for state K")
    n.add_argument("--deadline", type=float, default=150.0, help="seconds before giving up")
    n.add_argument("--seed", type=int, default=0)
    n.add_argument("--workdir", help="keep everything here (default: a temporary directory)")
    n.add_argument("--keep", action="store_true", help="do not delete the temporary directory")
    n.add_argument("--scenario", action="append", default=[], metavar="NAME",
                   help="inject a fault or an adversary and check the network copes (repeatable): "
                        f"{', '.join(SCENARIOS)} (docs/reliability.md)")
    n.add_argument("--device", default="auto", help=DEVICE_HELP + " (the trainer's and every daemon's)")
    return n


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)  # a malformed command line: usage and exit code 2 (argparse)
    return run_command(args, cmd_devnet, prog=PROG)
