"""``open1b-node``: the command line. Each command builds one typed result and renders it as
text, or as JSON with ``--json``. Exit codes: 0 success (and ``match`` for replay), 1 error,
2 mismatch or an incomplete devnet."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from open1b.protocol import Open1bError

DEFAULT_API = "127.0.0.1:5701"


def _data_dir(value: str | None) -> Path:
    return Path(value or os.environ.get("OPEN1B_PATH") or Path.home() / ".open1b")


def _print(obj, as_json: bool, render) -> None:
    print(json.dumps(obj, indent=2) if as_json else render(obj))


def cmd_daemon(args: argparse.Namespace) -> int:
    import trio

    from .daemon import Daemon, NodeConfig
    from .logs import setup_logging

    setup_logging(args.log_level, json_lines=args.log_json, prefix=args.log_prefix)
    host, port = _split_hostport(args.listen)
    api_host, api_port = _split_hostport(args.api)
    config = NodeConfig(
        data_dir=_data_dir(args.data_dir), listen_host=host, listen_port=port, api_host=api_host, api_port=api_port,
        bootstrap=tuple(args.bootstrap), run_dirs=tuple(Path(r) for r in args.run), audit=not args.no_audit,
        redundancy=args.redundancy, lease_s=args.lease,
    )
    try:
        trio.run(Daemon(config).run)
    except KeyboardInterrupt:
        pass
    return 0


def cmd_coverage(args: argparse.Namespace) -> int:
    from .client import call

    query = f"?redundancy={args.redundancy}" if args.redundancy else ""
    cov = call(args.api, f"/v1/coverage/{args.run}{query}")

    def render(c: dict) -> str:
        head = (f"run {c['run']}: {c['verified_steps']}/{c['steps']} verified, {c['claimed_steps']} claimed, "
                f"{c['unaudited_steps']} unaudited, disputed {c['disputed_steps'] or 'none'}")
        rows = [f"{s['step']:>6}  {s['status']:<9}  {len(s['auditors'])} match / {len(s['dissenters'])} mismatch"
                for s in c["per_step"]]
        return "\n".join([head, *rows])

    _print(cov, args.json, render)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from .client import call

    status = call(args.api, "/v1/status")

    def render(s: dict) -> str:
        return "\n".join([
            f"peer      {s['peer_id']}", f"listen    {', '.join(s['addrs'])}", f"peers     {len(s['peers'])}",
            f"runs      {len(s['runs'])}", f"stored    {s['attestations_stored']} attestations",
            f"replays   {s['replays']} ({s['replay_failures']} failed)", f"auditing  {s['audit']}",
        ])

    _print(status, args.json, render)
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from open1b.deterministic.replay import replay

    result = replay(Path(args.run), args.step)
    out = {"run": result.run.hex(), "step": result.step, "verdict": "match" if result.match else "mismatch",
           "pre_state": result.pre_state.hex(), "replayed_post_state": result.post_state.hex(),
           "published_post_state": result.expected.hex(), "elapsed_s": round(result.elapsed_s, 4)}
    _print(out, args.json, lambda o: "\n".join(f"{k:<22}{v}" for k, v in o.items()))
    return 0 if result.match else 2


def cmd_devnet(args: argparse.Namespace) -> int:
    from .devnet import DevnetOptions, dumps, render, run_devnet

    opts = DevnetOptions(nodes=args.nodes, steps=args.steps, redundancy=args.redundancy, tamper_step=args.tamper_step,
                         deadline_s=args.deadline, seed=args.seed, workdir=Path(args.workdir) if args.workdir else None,
                         keep=args.keep)
    summary = run_devnet(opts, progress=lambda line: print(f"devnet: {line}", file=sys.stderr, flush=True))
    print(dumps(summary) if args.json else render(summary))
    return 0 if summary["complete"] else 2


def _split_hostport(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="open1b-node", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("daemon", help="run a node")
    d.add_argument("--data-dir", help="data directory (default $OPEN1B_PATH or ~/.open1b)")
    d.add_argument("--listen", default="127.0.0.1:0", help="libp2p TCP listen HOST:PORT")
    d.add_argument("--api", default="127.0.0.1:0", help="local API HOST:PORT (0 = any free port)")
    d.add_argument("--bootstrap", action="append", default=[], help="peer multiaddr to dial (repeatable)")
    d.add_argument("--run", action="append", default=[], help="run directory to audit (repeatable)")
    d.add_argument("--no-audit", action="store_true", help="observe only: never claim or replay")
    d.add_argument("--redundancy", type=int, default=1, help="distinct attesters wanted per step")
    d.add_argument("--lease", type=int, default=120, help="claim lease in seconds")
    d.add_argument("--log-level", default="info")
    d.add_argument("--log-json", action="store_true", help="JSON-lines logs")
    d.add_argument("--log-prefix", default="", help=argparse.SUPPRESS)
    d.set_defaults(func=cmd_daemon)

    c = sub.add_parser("coverage", help="ask a running node for a run's coverage")
    c.add_argument("run", help="run id (hex, a unique prefix is enough)")
    c.add_argument("--api", default=DEFAULT_API, help="the node's API HOST:PORT")
    c.add_argument("--redundancy", type=int, help="target to judge completeness by (default: the node's)")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_coverage)

    s = sub.add_parser("status", help="ask a running node for its status")
    s.add_argument("--api", default=DEFAULT_API)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_status)

    r = sub.add_parser("replay", help="replay one step of a run directory locally")
    r.add_argument("run", help="run directory")
    r.add_argument("--step", type=int, required=True)
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=cmd_replay)

    n = sub.add_parser("devnet", help="train a run and audit it with a local network of daemons")
    n.add_argument("--nodes", type=int, default=3, help="auditor daemons (an observer is added)")
    n.add_argument("--steps", type=int, default=8)
    n.add_argument("--redundancy", type=int, default=1)
    n.add_argument("--tamper-step", type=int, help="forge the published state after this step")
    n.add_argument("--deadline", type=float, default=150.0, help="seconds before giving up")
    n.add_argument("--seed", type=int, default=0)
    n.add_argument("--workdir", help="keep everything here (default: a temporary directory)")
    n.add_argument("--keep", action="store_true", help="do not delete the temporary directory")
    n.add_argument("--json", action="store_true")
    n.set_defaults(func=cmd_devnet)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except Open1bError as exc:
        print(f"open1b-node: error: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"open1b-node: invalid input: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
