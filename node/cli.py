"""``open1b-node``: the command line. Each command builds one result and renders it as text, or
as JSON with ``--json``. Commands that ask a running daemon use its local API: ``--api``, or the
``api.addr`` the daemon wrote in its data directory.

Exit codes: 0 success (and ``match`` for replay); 1 error (or a FAIL from doctor); 2 mismatch,
or a devnet that did not complete before its deadline; ``dispute verify``: 0 a proof that
convicts, 2 one that is refused, 3 one this referee cannot judge.

``open1b-node devnet ARGS`` runs the test harness, a program of its own (``open1b-devnet ARGS``),
in a child process: the node imports none of it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from open1b.protocol import Open1bError

from . import answers
from .datadir import default_data_dir
from .results import CommandResult

if TYPE_CHECKING:
    from .config import NodeConfig
    from .daemon import Harness


def _api(args: argparse.Namespace) -> str:
    from .config import split_hostport

    if args.api:
        split_hostport(args.api)  # a malformed --api is the caller's error, said in one line
        return args.api
    from .client import ApiUnavailable
    from .daemon import API_ADDR_FILE
    from .files import FileRefused, read_bounded

    path = default_data_dir(args.data_dir) / API_ADDR_FILE
    try:
        return read_bounded(path, 256).decode(errors="replace").strip()
    except FileRefused:
        raise ApiUnavailable(f"no running daemon found for {path.parent} (start one, or pass --api HOST:PORT)") from None


def _token(args: argparse.Namespace) -> str | None:
    """The data dir's API token, which mutating routes need; ``None`` if this user cannot read it
    (then only read-only commands work)."""
    from .datadir import DataDirError, read_api_token

    try:
        return read_api_token(default_data_dir(args.data_dir))
    except DataDirError:
        return None


def _call(args: argparse.Namespace, path: str, shape: answers.Shape, **kw) -> Any:
    """The API's answer to ``path``, checked to have ``shape`` (what the command then reads)."""
    from .client import call

    return call(_api(args), path, shape=shape, token=_token(args), **kw)


def _table(rows: list[list[str]]) -> str:
    if not rows:
        return "(none)"
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


# -- commands --------------------------------------------------------------------------------
def cmd_init(args: argparse.Namespace) -> CommandResult:
    from .datadir import init_data_dir

    result = init_data_dir(default_data_dir(args.data_dir))
    out = {"data_dir": str(result.data_dir), "peer_id": result.peer_id, "created_key": result.created_key,
           "wrote_config": result.wrote_config}
    return CommandResult(out, lambda o: "\n".join([
        f"data dir  {o['data_dir']}", f"peer id   {o['peer_id']}",
        f"key       {'created' if o['created_key'] else 'kept (already there; keys are never overwritten)'}",
        f"config    {'written' if o['wrote_config'] else 'kept (already there)'}"]))


def cmd_daemon(args: argparse.Namespace) -> CommandResult:
    return serve_daemon(daemon_config(args))


def daemon_config(args: argparse.Namespace) -> NodeConfig:
    """What ``open1b-node daemon ARGS`` runs with: config.toml, then the flags. Sets up logging and
    the data directory first."""
    from .config import load_config
    from .datadir import init_data_dir
    from .logs import setup_logging

    setup_logging(args.log_level, json_lines=args.log_json, prefix=args.log_prefix,
                  file=Path(args.log_file) if args.log_file else None)
    data_dir = default_data_dir(args.data_dir)
    init_data_dir(data_dir)
    base = load_config(data_dir)
    return base.with_overrides(
        listen=args.listen, api=args.api, metrics=args.metrics, redundancy=args.redundancy, lease_s=args.lease,
        bootstrap=base.bootstrap + tuple(args.bootstrap), run_dirs=base.run_dirs + tuple(Path(r) for r in args.run),
        audit=False if args.no_audit else None, trust_policy=args.trust_policy,
        trusted_peers=base.trusted_peers + tuple(args.trust), publishers=base.publishers + tuple(args.publisher),
        device=args.device, answer_s=args.answer_seconds,
        spot_checks=False if args.no_spot_checks else None, spot_checks_in_flight=args.spot_checks_in_flight,
        disputes=False if args.no_disputes else None, dispute_round_s=args.dispute_round_seconds,
    )


def serve_daemon(config: NodeConfig, *, harness: Harness | None = None) -> CommandResult:
    """Run a daemon until it stops. ``harness`` is the daemon's test hook: only the devnet's own
    entry point (``python -m open1b.devnet.daemon_entry``) passes one."""
    # the network stack loads only once the configuration is known to be good: a bad argument
    # is refused in a fraction of a second
    import trio

    from .daemon import run_daemon

    try:
        trio.run(lambda: run_daemon(config, harness=harness))
    except KeyboardInterrupt:
        pass
    except BaseExceptionGroup as group:  # a component failed to start: say why in one line
        raise _first_cause(group) from None
    return CommandResult.nothing()


def cmd_ui(args: argparse.Namespace) -> CommandResult:
    """The web page's address. The token rides in the fragment, which a browser never sends to a
    server, so the page can run the checks that need it; it opens a browser when there is a display."""
    api = _api(args)
    _call(args, "/v1/status", answers.STATUS, timeout=3)  # a running node, not a stale api.addr
    token = _token(args)
    url = f"http://{api}/" + (f"#token={token}" if token else "")
    opened = False
    if not args.no_open and (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        import webbrowser

        opened = webbrowser.open(url)
    return CommandResult({"url": url, "opened": opened}, lambda o: o["url"])


def _first_cause(group: BaseExceptionGroup) -> BaseException:
    """The first leaf of an exception group that an operator can act on (a port in use, a full
    disk, a refused file), else the group itself (a bug: its traceback is wanted)."""
    for exc in group.exceptions:
        leaf = _first_cause(exc) if isinstance(exc, BaseExceptionGroup) else exc
        if isinstance(leaf, (Open1bError, OSError)):
            return leaf
    return group


def cmd_stop(args: argparse.Namespace) -> CommandResult:
    from .datadir import stop_daemon

    data_dir = default_data_dir(args.data_dir)
    pid = stop_daemon(data_dir, timeout_s=args.timeout)
    return CommandResult({"data_dir": str(data_dir), "stopped": pid}, lambda o: f"stopped the daemon (pid {o['stopped']})")


def cmd_restart(args: argparse.Namespace) -> CommandResult:
    """Stop the data dir's daemon (if one runs) and start a new one in the background, configured
    by config.toml alone (flags given to the old one are not known here), logging to a file."""
    import subprocess
    import time

    from .daemon import API_ADDR_FILE
    from .datadir import daemon_pid, stop_daemon

    data_dir = default_data_dir(args.data_dir).resolve()
    stopped = stop_daemon(data_dir, timeout_s=args.timeout) if daemon_pid(data_dir) is not None else None
    log_file = Path(args.log_file or data_dir / "daemon.log").resolve()
    proc = subprocess.Popen([sys.executable, "-m", "open1b.node.cli", "daemon", "--data-dir", str(data_dir),
                             "--log-file", str(log_file)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + args.timeout
    while not (data_dir / API_ADDR_FILE).exists():
        if proc.poll() is not None:
            raise Open1bError((proc.stderr.read().decode(errors="replace").strip() if proc.stderr else "")
                              or f"the new daemon exited with code {proc.returncode}; see {log_file}")
        if time.monotonic() > deadline:
            raise Open1bError(f"the new daemon (pid {proc.pid}) has not started listening after "
                              f"{args.timeout:.0f} s; see {log_file}")
        time.sleep(0.1)
    out = {"data_dir": str(data_dir), "stopped": stopped, "started": proc.pid, "log_file": str(log_file)}
    return CommandResult(out, lambda o: (f"stopped pid {o['stopped']}; " if o["stopped"] else "")
                         + f"started pid {o['started']}, logging to {o['log_file']}")


def cmd_trust(args: argparse.Namespace) -> CommandResult:
    """``trust add|remove|list``: the data dir's ``trusted_peers`` (config.toml), whose attestations
    coverage counts (the daemon reads its config at start: ``restart`` applies a change), and the
    keys that earned trust, recomputed from the store as the daemon does (docs/protocol.md §8.1.1)."""
    import dataclasses

    from .config import load_config, write_config
    from .datadir import check_version, daemon_pid

    data_dir = default_data_dir(args.data_dir)
    check_version(data_dir)
    config = load_config(data_dir)
    peers = list(config.trusted_peers)
    if args.trust_command == "add":
        peers += [p for p in dict.fromkeys(args.peer) if p not in peers]
    elif args.trust_command == "remove":
        unknown = [p for p in args.peer if p not in peers]
        if unknown:
            raise Open1bError(f"not trusted: {', '.join(unknown)}")
        peers = [p for p in peers if p not in args.peer]
    if peers != list(config.trusted_peers):
        write_config(dataclasses.replace(config, trusted_peers=tuple(peers)))  # checked peer IDs, atomically
    running = args.trust_command != "list" and peers != list(config.trusted_peers) and daemon_pid(data_dir) is not None
    out = {"trust_policy": config.trust_policy, "trusted_peers": peers, "restart_needed": running,
           "earn_trust": config.earn_trust and config.trust_policy == "allowlist",
           "earn_trust_matches": config.earn_trust_matches, "earn_trust_publishers": config.earn_trust_publishers,
           "earned": _earned(data_dir, config) if args.trust_command == "list" else []}

    def render(o: dict) -> str:
        lines = [f"trust policy {o['trust_policy']}: this node's own key and {len(o['trusted_peers'])} trusted peers"]
        lines += [f"  listed {p}" for p in o["trusted_peers"]]
        if o["restart_needed"]:
            lines.append("the daemon is running: apply with `open1b-node restart`")
        if args.trust_command != "list":
            return "\n".join(lines)
        if not o["earn_trust"]:
            return "\n".join([*lines, "earned trust: off (config: earn_trust, trust_policy)"])
        lines.append(f"earned trust: {len(o['earned'])} keys (each with {o['earn_trust_matches']} proven matches "
                     f"on steps a listed key proved, over a listed key's run or {o['earn_trust_publishers']} publishers)")
        for e in o["earned"]:
            lines.append(f"  earned {e['peer_id']}")
            lines += [f"    run {p['run'][:16]} step {p['step']} (publisher {p['publisher']})" for p in e["pairs"]]
        return "\n".join(lines)

    return CommandResult(out, render)


def _earned(data_dir: Path, config) -> list[dict]:
    """The keys that earned trust at this data dir's node: the daemon's rule over its store (read
    only; no store yet = nobody earned anything)."""
    import sqlite3

    from .earned_trust import EarnRule, earned_keys, evidence_from_store
    from .identity_file import load_identity
    from .store import STORE_FILE, Store
    from .views import earned_json

    path = data_dir / STORE_FILE
    if not (config.earn_trust and config.trust_policy == "allowlist") or not path.is_file():
        return []
    roots = config.trust(load_identity(data_dir).public_key).roots
    try:
        store = Store(path, read_only=True)
        try:
            earned = earned_keys(evidence_from_store(store, store.manifests()), roots=roots,
                                 quorum=config.dispute_quorum,
                                 rule=EarnRule(config.earn_trust_matches, config.earn_trust_publishers))
        finally:
            store.close()
    except sqlite3.Error as exc:  # not a store this node wrote (or a damaged one): say so in one line
        raise Open1bError(f"cannot read the statement store {path}: {exc}") from None
    return earned_json(earned)


def cmd_status(args: argparse.Namespace) -> CommandResult:
    status = _call(args, "/v1/status", answers.STATUS)
    return CommandResult(status, lambda s: "\n".join([
        f"peer       {s['peer_id']}", f"listen     {', '.join(s['addrs'])}",
        f"peers      {len(s['peers'])} connected, {s['peers_banned']} banned", f"runs       {len(s['runs'])}",
        f"stored     {s['attestations_stored']} attestations",
        f"replays    {s['replays']} ({s['replay_failures']} failed), claims won {s['claims_won']} / lost {s['claims_lost']}",
        f"gossip     {s['gossip_rejected']} rejected, {s['gossip_ignored']} ignored; {s['synced']} pulled by sync",
        f"auditing   {'yes' if s['audit'] else 'no (observer)'}"
        + (f", replaying step {s['replaying_step']}" if s['replaying_step'] is not None else ""),
        f"device     {_device_line(s['device'])}"]))


def _device_line(device: dict) -> str:
    if device["class"] is None:
        return f"{device['requested']} (the replay worker has not started)"
    return f"{device['class']}: {device['reason']}"


def cmd_peers(args: argparse.Namespace) -> CommandResult:
    peers = _call(args, "/v1/peers", answers.PEERS)
    return CommandResult(peers, lambda ps: _table([["PEER", "ADDRESS", "REJECTED"]]
                                         + [[p["peer_id"], (p["addrs"] or ["?"])[0], str(p["rejected"])] for p in ps]))


def cmd_runs(args: argparse.Namespace) -> CommandResult:
    runs = _call(args, "/v1/runs", answers.RUNS)
    # AUDITABLE is the JSON's `auditable`: this node can replay the run (its engine, its sizes)
    return CommandResult(runs, lambda rs: _table([["RUN", "STEPS", "ENGINE", "AUDITABLE"]]
                                        + [[r["run"], str(r["steps"]), r["engine"],
                                            "yes" if r.get("auditable", bool(r["run_dir"])) else "no"] for r in rs]))


def cmd_coverage(args: argparse.Namespace) -> CommandResult:
    query = f"?redundancy={args.redundancy}" if args.redundancy else ""
    cov = _call(args, f"/v1/coverage/{args.run}{query}", answers.COVERAGE)

    def render(c: dict) -> str:
        head = (f"run {c['run']}: {c['verified_steps']}/{c['steps']} verified, {c['claimed_steps']} claimed, "
                f"{c['unaudited_steps']} unaudited, disputed {c['disputed_steps'] or 'none'}"
                f" (refuted {c['refuted_steps'] or 'none'};"
                f" {'complete' if c['complete'] else 'incomplete'} at redundancy {c['redundancy']})")
        earned = c["policy"]["earned"]
        trust = (f"trust: {c['policy']['name']} ({len(c['policy']['roots']) - len(earned)} listed keys, "
                 f"{len(earned)} earned, quorum {c['policy']['quorum']}); "
                 f"{len(c['untrusted'])} untrusted attesters not counted")
        trust += "".join(f"\n  earned {p}: counted, it proved replays (`open1b-node trust list`)" for p in earned)
        if c["untrusted"]:  # say which keys, and how an operator who knows them makes them count
            trust += "".join(f"\n  untrusted {p}: it counts once it earns trust (docs/protocol.md §8.1.1), or "
                             f"`open1b-node trust add {p}` and restart" for p in c["untrusted"])
        flags = [f"flagged {f['signer']} at step {f['step']}: statement {f['statement'][:16]}… contradicts"
                 f" {f['conflicting'][:16]}…" if f.get("kind", "contradiction") == "contradiction" else
                 f"flagged {f['signer']} at step {f['step']} as a copier: statement {f['statement'][:16]}… binds"
                 f" another witness than reveal {f['reveal'][:16]}… (which {f['conflicting'][:16]}… binds)"
                 for f in c["flagged"]]
        rows = [["STEP", "STATUS", "MATCH", "MISMATCH", "CLAIMED BY"]] + [
            [str(s["step"]), s["status"], str(len(s["auditors"])), str(len(s["dissenters"])),
             ", ".join(p[-8:] for p in s["claimants"]) or "-"] for s in c["per_step"]]
        evals = [["STATE", "EVALUATION", "LOSS BITS", "MATCH", "MISMATCH"]] + [
            [str(e["state"]), e["status"], f"{e['loss_bits']:08x}" if e["loss_bits"] is not None else "-",
             str(len(e["checkers"])), str(len(e["dissenters"]))] for e in c.get("evaluations", [])]
        spot = c.get("spot_checks")
        escape = ([f"spot checks (not replays): {spot['spot_checked_steps']} steps passed, failed"
                   f" {spot['spot_failed_steps'] or 'none'}; escape probability of a forged run:"
                   f" {spot['escape_one_forged']:.3g} (1 step), {spot['escape_one_percent_forged']:.3g} (1% of steps)"
                   + (f"; this node does not spot check it: {spot['not_spot_checked_because']}"
                      if spot.get("not_spot_checked_because") else "")]
                  if spot else [])  # fmt: skip
        classes = [_classes_line(c, args.min_classes)] if args.min_classes else []
        return "\n".join([head, trust, *classes, *escape, *flags, _table(rows),
                          *([_table(evals)] if len(evals) > 1 else [])])

    # --min-classes: an operator's policy (docs/protocol.md §10.1); exit 2 like an incomplete run
    short = [s["step"] for s in cov["per_step"] if len(set(s["devices"])) < args.min_classes] if args.min_classes else []
    return CommandResult(cov, render, 2 if short else 0)


def _classes_line(c: dict, n: int) -> str:
    short = [s["step"] for s in c["per_step"] if len(set(s["devices"])) < n]
    return (f"device classes: {', '.join(sorted({d for s in c['per_step'] for d in s['devices']})) or 'none'}; "
            f"{len(short)} of {len(c['per_step'])} steps matched by fewer than {n}"
            + (f" (first: {', '.join(map(str, short[:8]))})" if short else ""))


def cmd_leaderboard(args: argparse.Namespace) -> CommandResult:
    from .evaluations import render_board

    return CommandResult(_call(args, "/v1/leaderboard", answers.LEADERBOARD), render_board)


def cmd_claims(args: argparse.Namespace) -> CommandResult:
    claims = _call(args, "/v1/claims" + (f"/{args.run}" if args.run else ""), answers.CLAIMS)
    return CommandResult(claims, lambda cs: _table([["RUN", "STEP", "SLOT", "CLAIMANT", "EXPIRES IN"]] + [
        [c["run"][:16], str(c["step"]), str(c["slot"]), c["claimant"], f"{c['expires_in_s']} s"] for c in cs]))


def _out_file(name: str) -> Path:
    """``--out FILE`` checked before anything is asked of the node: a file is written beside it and
    renamed over it, which would replace a symlink, a FIFO or a device (``/dev/null`` as root) with
    a regular file; those are refused, as an empty name is."""
    import stat

    if not name:
        raise Open1bError("--out is empty: name the file to write")
    out = Path(name)
    try:
        mode = out.lstat().st_mode
    except FileNotFoundError:
        return out
    except OSError as exc:
        raise Open1bError(f"cannot write --out {out}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(mode):
        raise Open1bError(f"cannot write --out {out}: refused: a symbolic link (name the file itself)")
    if not stat.S_ISREG(mode):
        raise Open1bError(f"cannot write --out {out}: refused: not a regular file")
    return out


def cmd_attestations(args: argparse.Namespace) -> CommandResult:
    query = f"?step={args.step}" if args.step is not None else ""
    out = None if args.out is None else _out_file(args.out)
    atts = _call(args, f"/v1/attestations/{args.run}{query}", answers.ATTESTATIONS)
    if out is not None:  # the form the library reads (examples/verify_coverage.py): one signed statement, hex, a line
        from .files import write_atomic

        try:
            write_atomic(out, "".join(a["encoded"] + "\n" for a in atts).encode())
        except OSError as exc:
            raise Open1bError(f"cannot write --out {out}: {exc.strerror or exc}") from None
        return CommandResult(atts, lambda xs: f"{len(xs)} attestations written to {out}, one hex-encoded per line")
    return CommandResult(atts, lambda xs: _table([["STEP", "VERDICT", "SIGNER", "ENGINE", "HARDWARE", "MS"]] + [
        [str(a["step"]), a["verdict"], a["signer"], a["engine"], a["hardware"], str(a["elapsed_ms"])] for a in xs]))


def cmd_publish(args: argparse.Namespace) -> CommandResult:
    from .client import publish
    from .jobs import JobState
    from .progress import progress

    run_dir = Path(args.dir)
    if not run_dir.is_dir():
        raise Open1bError(f"{run_dir} is not a directory")
    api = _api(args)
    try:  # only to size the progress bar: the daemon validates the manifest
        from open1b.deterministic.runfile import read_manifest

        from .runs import blob_count

        blobs = blob_count(read_manifest(run_dir))
    except Open1bError:
        blobs = 1
    phase = {JobState.CHECKING: 0, JobState.PROVIDING: blobs, JobState.ANNOUNCING: 2 * blobs,
             JobState.DONE: 2 * blobs, JobState.FAILED: 0}
    with progress(f"publishing {run_dir} (check every file, provide every blob)", 2 * blobs) as update:
        job = publish(api, run_dir, lambda j: update(min(phase.get(j["state"], 0) + j["done"], 2 * blobs), j["note"]),
                      token=_token(args), move=args.move)
    return CommandResult(job, lambda j: "\n".join([
        f"run        {j['run']}", f"steps      {j['steps']}", f"directory  {j['dir']}",
        f"{'moved' if j['moved'] else 'imported':<11}{j['bytes']} bytes into the blob cache "
        f"(pinned{'; the directory no longer holds them' if j['moved'] else ''})",
        f"providing  {j['provided']} blobs in the DHT",
        f"announced  {'gossiped on the runs topic' if j['gossiped'] else 'by sync only (' + j['note'] + ')'}",
        f"took       {j['seconds']} s"]))


def cmd_replay(args: argparse.Namespace) -> CommandResult:
    from open1b.deterministic.allocator import return_freed_arrays_promptly
    from open1b.deterministic.device_spec import parse_device_spec

    from .progress import progress

    parse_device_spec(args.device)  # a malformed --device is refused before any work
    return_freed_arrays_promptly()

    run_dir, held = Path(args.run), None
    if not run_dir.is_dir():  # a run id (or prefix) the node knows: it fetches the step's files
        runs = [r for r in _call(args, "/v1/runs", answers.RUNS) if r["run"].startswith(args.run.lower())]
        if len(runs) != 1 or not runs[0].get("auditable", runs[0]["run_dir"]):
            raise Open1bError(f"{args.run!r} is neither a run directory nor a single replayable run the node knows")
        files = f"/v1/fetch/{runs[0]['run']}?step={args.step}"
        with progress(f"fetching the files of step {args.step}", 1) as update:
            fetched = _call(args, files, answers.FETCHED, method="POST", timeout=3600)
            update(1, "verified")
        run_dir, held = Path(fetched["run_dir"]), files
    from open1b.deterministic.replay import replay

    try:
        with progress(f"replaying step {args.step}", 1) as update:
            update(0, f"choosing the device ({args.device}) and running its self-checks")
            device = _device(args.device)
            update(0, f"on {device.device_class}: loading, checking the checkpoint, replaying")
            result = replay(run_dir, args.step, device=device, out=args.out, spill_dir=args.spill_dir)
            update(1, "done")
    finally:
        if held is not None:  # the node keeps the files it fetched for us until told we are done
            try:
                _call(args, held, answers.RELEASED, method="DELETE")
            except Open1bError as exc:  # the verdict (or the replay's own error) matters more
                print(f"the node was not told the replay is done (its copy stays linked): {exc}", file=sys.stderr)
    out = {"run": result.run.hex(), "step": result.step, "verdict": "match" if result.match else "mismatch",
           "pre_state": result.pre_state.hex(), "replayed_post_state": result.post_state.hex(),
           "published_post_state": result.expected.hex(), "elapsed_s": round(result.elapsed_s, 4),
           "device": device.device_class, "device_reason": device.reason}
    return CommandResult(out, lambda o: "\n".join(f"{k:<22}{v}" for k, v in o.items()), 0 if result.match else 2)


def _device(spec: str):
    """The device a command computes on (``--device``): a GPU that is missing or fails the
    self-checks gives the CPU, which computes the same bits; the reason says so."""
    from open1b.deterministic.device import select_device_or_cpu

    return select_device_or_cpu(spec)


def cmd_reveal(args: argparse.Namespace) -> CommandResult:
    """The trainer's reveal of its replay witnesses after an audit (docs/run-format.md §5.2): each
    W_k is recomputed by replaying step k from RUN_DIR, checked against the manifest's C_k, and
    signed and gossiped by the daemon. Once W_k is public anyone can bind it: reveal after the audit."""
    from open1b.deterministic.replay import replay
    from open1b.deterministic.runfile import read_manifest
    from open1b.protocol.witness import witness_commitment

    from .progress import progress

    run_dir = Path(args.run_dir)
    manifest = read_manifest(run_dir)
    steps = args.step or list(range(manifest.steps))
    out = []
    with progress(f"replaying {len(steps)} steps to recompute their witnesses", len(steps)) as update:
        for i, step in enumerate(steps):
            witness = replay(run_dir, step, manifest).witness
            if witness_commitment(witness) != manifest.witnesses[step]:
                raise Open1bError(f"step {step}: the replay's witness does not open the manifest's C_{step}")
            out.append(_call(args, f"/v1/reveal/{manifest.run_id.hex()}?step={step}&witness={witness.hex()}",
                             answers.REVEAL, method="POST"))
            update(i + 1, f"step {step} revealed")
    return CommandResult(out, lambda rs: _table([["STEP", "WITNESS", "REVEAL"]] + [
        [str(r["step"]), r["witness"][:16] + "…", r["digest"][:16] + "…"] for r in rs]))


def cmd_samples(args: argparse.Namespace) -> CommandResult:
    from open1b.deterministic.provenance import run_step_samples

    manifest, result = run_step_samples(Path(args.run), args.step, rank=args.rank)
    out = {"run": manifest.run_id.hex(), **result.to_json()}

    def render(o: dict) -> str:
        lines = [f"run {o['run']} step {o['step']}: {len(o['uses'])} rows, every proof verified against"
                 f" samples_root {o['samples_root']} (N = {o['samples']})"]
        for u in o["uses"]:
            lines.append(f"rank {u['rank']}  micro-batch {u['micro_batch']}  row {u['row']}  sample {u['index']}"
                         f"  digest {u['digest']}")
            lines += [f"    {'proof' if n == 0 else '':<6}{h}" for n, h in enumerate(u["proof"])]
        return "\n".join(lines)

    return CommandResult(out, render)


MAX_DOCTOR_RUNS = 16  # runs whose trust doctor explains


def cmd_doctor(args: argparse.Namespace) -> CommandResult:
    from .client import ApiUnavailable
    from .doctor import overall, run_checks

    try:
        status = _call(args, "/v1/status", answers.STATUS, timeout=3)
        coverages = [_call(args, f"/v1/coverage/{run}", answers.COVERAGE, timeout=10)
                     for run in status["runs"][:MAX_DOCTOR_RUNS]]
    except ApiUnavailable:
        status, coverages = None, []
    checks = run_checks(default_data_dir(args.data_dir), status, args.device, coverages)
    verdict = overall(checks)
    out = [c.as_json() for c in checks]
    out.append({"check": "overall", "level": verdict, "detail": "a refused GPU alone is a WARN: the CPU gives the same bits"})
    return CommandResult(out, lambda xs: _table([[x["level"], x["check"], x["detail"]] for x in xs]),
                         1 if verdict == "FAIL" else 0)


def cmd_key_show(args: argparse.Namespace) -> CommandResult:
    from .identity_file import key_path, load_identity

    data_dir = default_data_dir(args.data_dir)
    identity = load_identity(data_dir)
    out = {"peer_id": identity.peer_id, "public_key": identity.public_key.hex(), "key_file": str(key_path(data_dir))}
    return CommandResult(out, lambda o: "\n".join(f"{k:<11} {v}" for k, v in o.items()))


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def cmd_train(args: argparse.Namespace) -> CommandResult:
    from open1b.deterministic.allocator import return_freed_arrays_promptly
    from open1b.deterministic.config import PRESETS
    from open1b.deterministic.distributed import launched_rank
    from open1b.deterministic.trainer import publish_run

    from .datadir import init_data_dir
    from .identity_file import load_identity
    from .progress import progress

    if args.preset and args.preset not in PRESETS:
        raise Open1bError(f"unknown preset {args.preset!r}; choose one of {', '.join(sorted(PRESETS))}")
    return_freed_arrays_promptly()
    out_dir = _fresh_run_dir(Path(args.out))
    data_dir = default_data_dir(args.data_dir)
    init_data_dir(data_dir)
    options = {"preset": args.preset} if args.preset else {}
    several = bool(args.ranks and args.ranks > 1)
    launched = launched_rank()
    if several and args.device.startswith("cuda"):
        raise Open1bError("--device cuda trains in one process: use it without --ranks (W > 1 ranks train on the CPU)")
    device = None if several else _device(args.device)
    ranks = f" on {args.ranks} processes (torch.distributed, gloo)" if several else f" on {device.device_class}"
    with progress(f"training {args.steps} steps into {args.out}{ranks}", args.steps) as update:
        manifest = publish_run(out_dir, load_identity(data_dir), steps=args.steps, seed=args.seed,
                               tamper_step=args.tamper_step, ranks=args.ranks, device=device,
                               eval_documents=args.eval_documents, eval_every=args.eval_every,
                               fingerprints=args.fingerprints, spill_dir=args.spill_dir,
                               progress=lambda done, total: update(done, ""), **options)
    out = {"run": manifest.run_id.hex(), "steps": manifest.steps, "out": str(Path(args.out).resolve()),
           "publisher": manifest.signer_peer_id, "engine": f"{manifest.engine} {manifest.engine_version}",
           "ranks": manifest.model["ranks"], "device": device.device_class if device else "cpu (one process a rank)",
           "fingerprints": manifest.data.get("fingerprints_root", "none")}
    if launched is not None:  # torchrun (or the like) started this process as one rank of several
        out["launched_rank"] = launched[0]
    return CommandResult(out, lambda o: "\n".join(f"{k:<10} {v}" for k, v in o.items()))


def _fresh_run_dir(out: Path) -> Path:
    """``train --out``: a new directory, an empty one, or an earlier run directory, whose run files
    are removed first (a shorter run must not leave the old run's later checkpoints behind).
    Anything else is refused rather than mixed with a run."""
    from open1b.deterministic.runfile import CHECKPOINT_DIR, EVALUATIONS_FILE, MANIFEST_FILE, SAMPLES_FILE
    from open1b.protocol.fingerprints import FINGERPRINTS_FILE

    if out.exists() and not out.is_dir():
        raise Open1bError(f"--out {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        if not (out / MANIFEST_FILE).is_file():
            raise Open1bError(f"--out {out} is a non-empty directory that holds no run; choose a new or empty one")
        for path in [out / MANIFEST_FILE, out / SAMPLES_FILE, out / FINGERPRINTS_FILE, out / EVALUATIONS_FILE,
                     *(out / CHECKPOINT_DIR).glob("*.safetensors")]:
            path.unlink(missing_ok=True)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise Open1bError(f"cannot create --out {out}: {exc.strerror}") from None
    return out


# -- parser ----------------------------------------------------------------------------------
DEVICE_HELP = ("where to compute: auto (a CUDA device that passes the self-checks, else the CPU), cpu, cuda or "
               "cuda:N; a GPU that is missing or fails the self-checks falls back to the CPU, which gives the same bits")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="open1b-node", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data-dir", help="data directory (default $OPEN1B_PATH, else ~/.open1b)")
    reporting = argparse.ArgumentParser(add_help=False, parents=[common])
    reporting.add_argument("--json", action="store_true", help="machine-readable output")
    client = argparse.ArgumentParser(add_help=False, parents=[reporting])
    client.add_argument("--api", help="the daemon's API HOST:PORT (default: the data dir's api.addr)")
    sub = p.add_subparsers(dest="command", required=True)

    sub.add_parser("init", parents=[reporting], help="create the data directory, key and config").set_defaults(func=cmd_init)

    d = sub.add_parser("daemon", parents=[common], help="run a node (initialises the data dir if needed)")
    d.add_argument("--listen", help="libp2p TCP listen HOST:PORT (config: listen)")
    d.add_argument("--api", help="local API HOST:PORT; port 0 picks a free one (config: api)")
    d.add_argument("--metrics", help="serve Prometheus metrics on HOST:PORT (config: metrics)")
    d.add_argument("--bootstrap", action="append", default=[], help="peer multiaddr to dial (repeatable; adds to config)")
    d.add_argument("--run", action="append", default=[], help="run directory to audit (repeatable; adds to config)")
    d.add_argument("--no-audit", action="store_true", help="observe only: never claim or replay")
    d.add_argument("--redundancy", type=int, help="distinct attesters wanted per step (config: redundancy)")
    d.add_argument("--lease", type=int, help="claim lease in seconds (config: lease_seconds)")
    d.add_argument("--trust-policy", choices=["allowlist", "open"],
                   help="whose attestations count: this node and its trusted peers, or every key (config: trust_policy)")
    d.add_argument("--trust", action="append", default=[], metavar="PEER_ID",
                   help="a peer whose attestations count (repeatable; adds to config: trusted_peers)")
    d.add_argument("--publisher", action="append", default=[], metavar="PEER_ID",
                   help="audit only runs this peer published (repeatable; adds to config: publishers; "
                        "default: runs of any publisher)")
    d.add_argument("--device", help=DEVICE_HELP + " (config: device)")
    d.add_argument("--answer-seconds", type=float, metavar="S",
                   help="how long a spot check waits for the trainer's answer before signing no_answer"
                        " (config: answer_seconds; default: the spec's ANSWER_SECONDS, 3600)")
    d.add_argument("--no-spot-checks", action="store_true",
                   help="replay only: never spot check (config: spot_checks = false)")
    d.add_argument("--spot-checks-in-flight", type=int, metavar="N",
                   help="spot checks at once while some step has none (config: spot_checks_in_flight; default 1)")
    d.add_argument("--no-disputes", action="store_true",
                   help="never open nor answer a dispute (config: disputes = false)")
    d.add_argument("--dispute-round-seconds", type=float, metavar="S",
                   help="how long a disputing peer may take per exchange before it loses"
                        " (config: dispute_round_seconds; default: the spec's ROUND_TIMEOUT_S, 60)")
    d.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    d.add_argument("--log-json", action="store_true", help="JSON-lines logs")
    d.add_argument("--log-file", help="log to this file (rotated at 10 MiB, 5 kept) instead of stderr")
    d.add_argument("--log-prefix", default="", help=argparse.SUPPRESS)
    d.set_defaults(func=cmd_daemon)

    pb = sub.add_parser("publish", parents=[client],
                        help="announce a run directory: the daemon checks every file against the manifest,"
                             " serves them to peers and gossips the manifest")
    pb.add_argument("dir", help="run directory (manifest.cbor, checkpoints/, samples.bin)")
    pb.add_argument("--move", action="store_true",
                    help="rename the run's files into the node's blob cache instead of copying them (no second "
                         "copy of a large run on disk); the directory must be on the cache's filesystem")
    pb.set_defaults(func=cmd_publish)

    for name, func, what in (("stop", cmd_stop, "stop the data dir's daemon cleanly (SIGTERM) and wait until it has"),
                             ("restart", cmd_restart, "stop the data dir's daemon and start it again in the background"
                                                      " (config.toml only; logs to --log-file, else DATA_DIR/daemon.log)")):
        sp = sub.add_parser(name, parents=[reporting], help=what)
        sp.add_argument("--timeout", type=_at_least_one, default=60, help="seconds to wait (default 60)")
        if name == "restart":
            sp.add_argument("--log-file", help="the new daemon's log file (default DATA_DIR/daemon.log)")
        sp.set_defaults(func=func)

    sub.add_parser("status", parents=[client], help="the daemon's status").set_defaults(func=cmd_status)
    u = sub.add_parser("ui", parents=[client], help="the web page's URL (and open it in a browser when there is a display)")
    u.add_argument("--no-open", action="store_true", help="only print the URL")
    u.set_defaults(func=cmd_ui)
    sub.add_parser("peers", parents=[client], help="connected peers").set_defaults(func=cmd_peers)
    sub.add_parser("runs", parents=[client], help="runs the daemon knows").set_defaults(func=cmd_runs)

    c = sub.add_parser("coverage", parents=[client], help="a run's coverage, from any running node")
    c.add_argument("run", help="run id (hex; a unique prefix is enough)")
    c.add_argument("--redundancy", type=int, help="target to judge completeness by (default: the node's)")
    c.add_argument("--min-classes", type=_at_least_one, metavar="N",
                   help="require every step matched by N distinct device classes (exit 2 if not)")
    c.set_defaults(func=cmd_coverage)

    sub.add_parser("leaderboard", parents=[client],
                   help="runs ranked by certified evaluation loss, from the node's signed statements").set_defaults(
        func=cmd_leaderboard)

    cl = sub.add_parser("claims", parents=[client], help="live claims the daemon knows")
    cl.add_argument("run", nargs="?", help="only this run")
    cl.set_defaults(func=cmd_claims)

    a = sub.add_parser("attestations", parents=[client], help="attestations of a run")
    a.add_argument("run")
    a.add_argument("--step", type=int)
    a.add_argument("--out", metavar="FILE", help="also write them to FILE, one hex-encoded statement per line "
                                                 "(what examples/verify_coverage.py and the library read)")
    a.set_defaults(func=cmd_attestations)

    r = sub.add_parser("replay", parents=[client], help="replay one step locally: match (0) or mismatch (2)")
    r.add_argument("run", help="a run directory, or a run id the daemon knows")
    r.add_argument("--step", type=int, required=True)
    r.add_argument("--device", default="auto", help=DEVICE_HELP)
    r.add_argument("--out", type=Path, help="also write the replayed state K+1 to this checkpoint file (CPU only)")
    r.add_argument("--spill-dir", type=Path, help="directory of the CPU step's spill file, where gradient sums wait "
                                                  "on disk (default: the run directory; not a tmpfs)")
    r.set_defaults(func=cmd_replay)

    rv = sub.add_parser("reveal", parents=[client],
                        help="after an audit: publish a run's replay witnesses (recomputed from RUN_DIR)")
    rv.add_argument("run_dir", help="the run directory (manifest and checkpoints)")
    rv.add_argument("--step", type=int, action="append", help="only these steps (default: all)")
    rv.set_defaults(func=cmd_reveal)

    sm = sub.add_parser("samples", parents=[reporting],
                        help="which samples a step used, each with its Merkle proof against the manifest")
    sm.add_argument("run", help="a run directory")
    sm.add_argument("--step", type=int, required=True)
    sm.add_argument("--rank", type=int, help="only this rank's rows")
    sm.set_defaults(func=cmd_samples)

    dr = sub.add_parser("doctor", parents=[client], help="check this machine and node: OK / WARN / FAIL")
    dr.add_argument("--device", help="the device to check the GPU lines for (default: config's device, else auto)")
    dr.set_defaults(func=cmd_doctor)

    tr = sub.add_parser("trust", help="whose attestations coverage counts (config: trusted_peers)")
    trsub = tr.add_subparsers(dest="trust_command", required=True)
    for name, what in (("add", "count these peers' attestations"), ("remove", "stop counting them")):
        ta = trsub.add_parser(name, parents=[reporting], help=what)
        ta.add_argument("peer", nargs="+", metavar="PEER_ID")
        ta.set_defaults(func=cmd_trust)
    trsub.add_parser("list", parents=[reporting], help="the trust policy, trusted peers and earned keys with their evidence").set_defaults(
        func=cmd_trust)

    k = sub.add_parser("key", help="the node key")
    ksub = k.add_subparsers(dest="key_command", required=True)
    ksub.add_parser("show", parents=[reporting], help="peer ID and public key (never the secret)").set_defaults(
        func=cmd_key_show)

    t = sub.add_parser("train", parents=[reporting], help="train and publish a run directory, signed with the node key")
    t.add_argument("--steps", type=int, required=True)
    t.add_argument("--out", required=True, help="run directory to write")
    t.add_argument("--preset", help="model preset (default: the engine's default)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--tamper-step", type=int, help="forge the published state after this step (for testing auditors)")
    t.add_argument("--ranks", type=_at_least_one, metavar="W",
                   help="data-parallel ranks: W > 1 trains in W processes (torch.distributed, gloo); "
                        "default: the preset's topology, in one process")
    t.add_argument("--device", default="auto", help=DEVICE_HELP)
    t.add_argument("--spill-dir", type=Path, help="directory of the one-process CPU trainer's spill file, where "
                                                  "gradient sums wait on disk (default: --out; not a tmpfs)")
    t.add_argument("--eval-documents", type=int, default=0, metavar="H",
                   help="hold out the corpus's last H documents as a committed evaluation set (docs/run-format.md §9)")
    t.add_argument("--eval-every", type=_at_least_one, default=1, metavar="V", help="evaluate every V-th state")
    t.add_argument("--no-fingerprints", dest="fingerprints", action="store_false",
                   help="do not record step fingerprints (docs/run-format.md §10): the run cannot be spot checked")
    t.set_defaults(func=cmd_train)

    from .verify_handoff import add_parser as add_verify_handoff  # Open-1B v3 hand-off check
    add_verify_handoff(sub, parents=[reporting])
    from .data_command import add_parser as add_data  # data inclusion and exclusion proofs
    add_data(sub, parents=[reporting])
    from .dispute_command import add_parser as add_dispute  # fraud proofs, judged offline
    add_dispute(sub, parents=[reporting])
    return p


def _os_error(exc: OSError) -> str:
    where = f"{exc.filename}: " if exc.filename else ""
    return f"{where}{exc.strerror or exc}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["devnet"]:
        return _devnet(argv[1:])
    args = parser().parse_args(argv)  # a malformed command line: usage and exit code 2 (argparse)
    return run_command(args, args.func)


def _devnet(argv: list[str]) -> int:
    """``open1b-node devnet ARGS`` is ``open1b-devnet ARGS``: the test harness is a program of its
    own, run in a child process so that the node imports none of it."""
    import subprocess

    child = subprocess.Popen([sys.executable, "-m", "open1b.devnet", *argv])
    while True:
        try:
            code = child.wait()
        except KeyboardInterrupt:  # the child had the same SIGINT: it stops its daemons, then exits
            continue
        return code if code >= 0 else 128 - code  # killed by a signal: the shell's convention


def run_command(args: argparse.Namespace, command: Callable[[argparse.Namespace], CommandResult], *,
                prog: str = "open1b-node") -> int:
    """``command(args)``, rendered, and its exit code; an error the caller can act on is one line
    on stderr and exit code 1."""
    try:
        result = command(args)
    except Open1bError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"{prog}: invalid input: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a file or directory the caller named that the system refused
        print(f"{prog}: error: {_os_error(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    # The one place a result is rendered: as text, or as JSON with --json.
    if result.data is not None:
        print(json.dumps(result.data, indent=2) if getattr(args, "json", False) else result.render(result.data))
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
