"""Every CLI command with hostile arguments (issue 15): files, directories, FIFOs, symlinks to
devices, paths under files, a read-only mount, huge and negative numbers, malformed and wrong
ports. Each must end with one clear line and a defined exit code, never a traceback.

Each case runs in its own process, forked from this one once the command's modules are imported:
what ``open1b-node ARGS`` runs (:func:`open1b.node.cli.main`, its exit code, its stdout and
stderr, an uncaught exception printed as Python would), without paying the interpreter's and the
engine's start-up ~250 times (it made this the slowest test of the suite). The real console
script is started as a subprocess by the other CLI tests."""

from __future__ import annotations

import concurrent.futures
import http.server
import io
import json
import os
import selectors
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import traceback

import pytest

from open1b.node.cli import main, parser

pytestmark = pytest.mark.integration

HUGE = "9" * 30
EXIT_CODES = {1, 2}  # 1: refused with a one-line error; 2: argparse's usage error
REPORTS = {"doctor"}


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """A directory of hostile things to name, a TCP port that answers in something not HTTP (as a
    libp2p port does), and an API port that answers with attestations."""
    root = tmp_path_factory.mktemp("hostile")
    (root / "afile").write_bytes(b"not a directory")
    (root / "adir").mkdir()
    os.mkfifo(root / "fifo")
    with open(root / "huge", "wb") as f:  # sparse: larger than any bounded read, costing no disk
        f.truncate(1 << 30)
    (root / "zero").symlink_to("/dev/zero")
    (root / "dangling").symlink_to(root / "nothing-here")
    (root / "ro").mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(root / "ro")],
                             capture_output=True)
    assert mounted.returncode == 0, mounted.stderr  # the suite runs as root
    garbage = socket.socket()
    garbage.bind(("127.0.0.1", 0))
    garbage.listen()
    busy = garbage.getsockname()[1]

    def answer_garbage():
        while True:
            try:
                conn, _ = garbage.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"\x13/multistream/1.0.0\n" * 4)

    threading.Thread(target=answer_garbage, daemon=True).start()
    api = _attestations_api()
    try:
        yield root, busy, api.server_address[1]
    finally:
        api.shutdown()
        garbage.close()
        subprocess.run(["umount", "-l", str(root / "ro")], check=True)


def _attestations_api() -> http.server.ThreadingHTTPServer:
    """An API on loopback that answers every GET with two valid attestations (what a node's
    ``/v1/attestations/RUN`` returns), so that ``attestations --out`` gets as far as writing."""
    from open1b.node.views import attestation_json
    from tests.protocol.conftest import ident, make_attestation, make_manifest

    manifest = make_manifest(ident(0), steps=1)
    body = json.dumps([attestation_json(make_attestation(ident(i), manifest, 0)) for i in (1, 2)]).encode()

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


PATHS = ["afile", "adir", "fifo", "zero", "dangling", "afile/sub", "/proc/x", "ro/sub", ""]


def cases(busy: int, answering: int) -> dict[str, list[list[str]]]:
    """Hostile argument lists per command (the test fails if a command has none). ``answering`` is
    an API port that answers with attestations (``attestations --out`` then writes; ``afile`` is
    left out there: others read it, and replacing a regular file is what ``--out`` does)."""
    api_bad = ["127.0.0.1:abc", "127.0.0.1:99999", "nohost", f"127.0.0.1:{busy}", "127.0.0.1:1", ":", HUGE]
    client = [["--api", a] for a in api_bad] + [["--data-dir", p] for p in PATHS]
    daemon_base = ["--listen", f"127.0.0.1:{busy}", "--api", "127.0.0.1:0"]
    return {
        "init": [["--data-dir", p] for p in PATHS],
        "daemon": [["--data-dir", p, *daemon_base] for p in PATHS]
        + [["--data-dir", "d-daemon", *daemon_base, *extra] for extra in (
            [], ["--listen", "127.0.0.1:abc"], ["--listen", f"127.0.0.1:{HUGE}"], ["--api", "127.0.0.1:-1"],
            ["--metrics", "nohost"], ["--metrics", f"127.0.0.1:{busy}"], ["--bootstrap", "zero"],
            ["--bootstrap", "/ip4/1.2.3.4/tcp/1"], ["--run", "fifo"], ["--run", "zero"], ["--run", "afile"],
            ["--run", "adir"], ["--redundancy", "-1"], ["--redundancy", HUGE], ["--lease", HUGE], ["--lease", "0"],
            ["--trust", "abc"], ["--publisher", "zero"], ["--log-file", "adir"], ["--log-file", "/proc/x/y"],
            ["--log-level", "loud"], ["--device", "nope"], ["--device", "cuda:" + HUGE],
            ["--answer-seconds", "-1"], ["--answer-seconds", HUGE], ["--answer-seconds", "abc"],
            ["--spot-checks-in-flight", "0"], ["--spot-checks-in-flight", HUGE], ["--spot-checks-in-flight", "x"])],
        "stop": [["--data-dir", p] for p in PATHS] + [["--timeout", t] for t in ("-1", HUGE, "abc")],
        # (a valid data dir would really start a daemon: only refusals here; tests/node/test_lifecycle.py starts one)
        "restart": [["--data-dir", p] for p in PATHS if p not in ("adir", "")] + [["--timeout", t] for t in ("0", "abc")],
        "publish": [[p, "--api", "127.0.0.1:1"] for p in PATHS] + [["adir", *c] for c in client],
        "status": client, "peers": client, "runs": client,
        "doctor": [["--data-dir", p] for p in PATHS] + [["--api", a] for a in api_bad] + [["--device", "nope"]],
        "coverage": [["x", *c] for c in client] + [["x", "--redundancy", n, "--api", "127.0.0.1:1"]
                                                   for n in (HUGE, "-1", "abc")],
        "claims": [["x", *c] for c in client],
        "leaderboard": client,
        "ui": [["--no-open", *c] for c in client],
        "data": [[p] for p in PATHS] + [["adir", "--include", p] for p in ("zero", "fifo", HUGE)]
        + [["adir", "--exclude", "fifo"], ["adir", "--text", "zero"], ["adir", "--text", "fifo"]],
        "attestations": [["x", "--step", n, "--api", "127.0.0.1:1"] for n in (HUGE, "-1", "abc")]
        + [["x", "--out", p, "--api", api] for p in PATHS if p != "afile" for api in ("127.0.0.1:1",
                                                                                       f"127.0.0.1:{answering}")],
        "replay": [[p, "--step", "0", "--api", "127.0.0.1:1"] for p in PATHS]
        + [["adir", "--step", n] for n in (HUGE, "-1", "abc")],
        "reveal": [[p, "--api", "127.0.0.1:1"] for p in PATHS] + [["adir", "--step", HUGE]],
        "samples": [[p, "--step", "0"] for p in PATHS] + [["adir", "--step", HUGE], ["adir", "--step", "0",
                                                                                        "--rank", "-1"]],
        "key": [["show", "--data-dir", p] for p in PATHS] + [["nope"]],
        "trust": [["list", "--data-dir", p] for p in PATHS] + [["add", "--data-dir", p, "12D3KooWabc"] for p in PATHS]
        + [["add", "--data-dir", "d-trust", peer] for peer in ("abc", "", HUGE, "12D3KooW" + "1" * 44)]
        + [["remove", "--data-dir", "d-trust", "12D3KooWabc"], ["nope"]],
        "train": [["--steps", "1", "--out", p, "--data-dir", "d-train"] for p in PATHS]
        + [["--steps", "1", "--out", "t-out", "--data-dir", p] for p in PATHS]
        + [["--steps", n, "--out", "t-out", "--data-dir", "d-train"] for n in (HUGE, "-1", "0", "abc")]
        + [["--steps", "1", "--out", "t-out", "--data-dir", "d-train", *extra] for extra in (
            ["--preset", "nope"], ["--preset", ""], ["--ranks", HUGE], ["--ranks", "0"], ["--seed", HUGE],
            ["--seed", "-1"], ["--tamper-step", HUGE], ["--tamper-step", "-1"], ["--device", "nope"])],
        "devnet": [["--nodes", n] for n in ("0", "-1", HUGE)] + [["--steps", n] for n in ("0", HUGE)]
        + [["--redundancy", "9"], ["--deadline", "abc"], ["--scenario", "nope"], ["--tamper-step", HUGE]],
        "dispute": [["verify", p] for p in PATHS] + [["verify", p, "--follow"] for p in ("zero", "dangling")]
        + [["verify", "huge"], ["nope"], ["verify"]],
        "verify-handoff": [[p] for p in PATHS] + [["adir", "--expected", "zz"], ["adir", "--state-hashes", "fifo"],
                                                  ["adir", "--state-hashes", "zero"]],
    }


def forked_cli(*args: str, timeout: float) -> tuple[int, str, str] | None:
    """``open1b-node ARGS`` in a forked child: (exit code, stdout, stderr), or None if it was
    still running after ``timeout`` seconds (then it is killed)."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: exactly what the console script does once its imports are done
        code = 1
        try:
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            for fd in (out_r, out_w, err_r, err_w):
                os.close(fd)
            sys.stdin = open(os.devnull)
            sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
            sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            try:
                code = main(list(args))
            except SystemExit as exc:  # argparse's usage errors, as the interpreter reports them
                code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
                if not isinstance(exc.code, int | None):
                    print(exc.code, file=sys.stderr)
            except BaseException:  # what the interpreter prints for an uncaught exception
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
    os.close(out_w)
    os.close(err_w)
    chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        for fd in chunks:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map() and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=max(0.0, deadline - time.monotonic())):
                data = os.read(key.fd, 65536)
                if data:
                    chunks[key.fd].append(data)
                else:
                    sel.unregister(key.fd)
        timed_out = bool(sel.get_map())
    if timed_out:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    for fd in chunks:
        os.close(fd)
    if timed_out:
        return None
    text = {fd: b"".join(parts).decode(errors="replace") for fd, parts in chunks.items()}
    return os.waitstatus_to_exitcode(status), text[out_r], text[err_r]


def refusals(command: str, argument_lists: list[list[str]]) -> list[str]:
    """Run ``command`` with each argument list in turn; the failures, one paragraph each."""
    failures = []
    for args in argument_lists:
        result = forked_cli(command, *args, timeout=60)
        if result is None:
            failures.append(f"open1b-node {command} {' '.join(args)} -> still running after 60 s")
            continue
        rc, out, err = result
        lines = [line for line in err.splitlines() if line.strip()]
        usage = rc == 2 and lines and lines[0].startswith("usage:")
        # progress lines may precede it; the error itself is the last line, and only one
        prog = "open1b-devnet: " if command == "devnet" else "open1b-node: "
        one_line = rc in EXIT_CODES and lines and lines[-1].startswith(prog) and sum(
            line.startswith(prog) for line in lines) == 1
        # doctor reports (OK / WARN / FAIL rows, exit 1 on a FAIL) instead of refusing
        report = command in REPORTS and rc in (0, 1) and not lines and out.strip()
        # `dispute verify` judges any regular file: garbage is a refused proof, one verdict line (exit 2)
        verdict = command == "dispute" and rc == 2 and not lines and len(out.strip().splitlines()) == 1
        # an odd but valid input (an empty directory as a data dir) may simply succeed
        if "Traceback" in err or not (rc == 0 or usage or one_line or report or verdict):
            failures.append(f"open1b-node {command} {' '.join(args)} -> rc {rc}: {err[-600:]}")
    return failures


def test_every_command_refuses_hostile_arguments_in_one_line(hostile, monkeypatch):
    root, busy, answering = hostile
    monkeypatch.setenv("OPEN1B_PATH", str(root / "default-data-dir"))  # never the real ~/.open1b
    monkeypatch.chdir(root)
    table = cases(busy, answering)
    # what the commands import, imported once here so that no forked case pays for it
    import open1b.deterministic.replay  # noqa: F401
    import open1b.deterministic.trainer  # noqa: F401
    import open1b.node.daemon  # noqa: F401
    import open1b.node.doctor  # noqa: F401

    # `devnet` is not the parser's: main() hands it to the harness's own program (open1b-devnet)
    commands = set(next(a for a in parser()._actions if a.dest == "command").choices) | {"devnet"}
    assert commands <= set(table), f"commands without hostile cases: {sorted(commands - set(table))}"
    # `init` may turn the empty `adir` into a data dir, which later commands then name: it runs
    # first and alone. The other commands share no state they write (each command's own data dirs
    # are used by it alone, one case after another), so they run side by side: ~250 processes,
    # which one after another made this the slowest test of the suite.
    failures = refusals("init", table["init"])
    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        for found in pool.map(lambda c: refusals(c, table[c]), sorted(commands - {"init"})):
            failures += found
    assert not failures, "\n\n".join(failures)
    assert not (root / "dangling").exists() and not (root / "nothing-here").exists()  # nothing created through links
    # nothing half-written (attestations --out writes a temporary file beside its target), nothing replaced
    assert not [p for p in root.rglob(".*.tmp")], sorted(root.rglob(".*.tmp"))
    assert stat.S_ISFIFO((root / "fifo").lstat().st_mode) and (root / "zero").is_symlink() and (root / "dangling").is_symlink()


def test_attestations_out_writes_what_the_library_reads_and_a_bad_file_is_one_line(tmp_path, monkeypatch, capsys):
    from open1b.node import cli as node_cli
    from open1b.node import client
    from open1b.node.views import attestation_json
    from open1b.protocol import Attestation
    from tests.protocol.conftest import ident, make_attestation, make_manifest

    manifest = make_manifest(ident(0), steps=2)
    atts = [make_attestation(ident(i), manifest, k) for k in range(2) for i in (1, 2)]
    asked = []

    def answer(api, path, method, timeout, token):
        asked.append(path)
        return [attestation_json(a) for a in atts]

    monkeypatch.setattr(client, "_request", answer)
    out = tmp_path / "atts.hex"
    for _ in range(2):  # a new file, then the same one replaced
        assert node_cli.main(["attestations", "ab", "--api", "127.0.0.1:1", "--out", str(out)]) == 0
        assert [Attestation.decode(bytes.fromhex(line)) for line in out.read_text().splitlines()] == atts
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("kept")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "zero").symlink_to("/dev/zero")
    (tmp_path / "dangling").symlink_to(tmp_path / "nothing-here")
    (tmp_path / "alink").symlink_to(tmp_path / "afile")
    before = sorted(p.name for p in tmp_path.iterdir())
    capsys.readouterr()
    refused = {"adir": "refused: not a regular file", "fifo": "refused: not a regular file",
               "zero": "refused: a symbolic link", "dangling": "refused: a symbolic link",
               "alink": "refused: a symbolic link", "afile/sub": "Not a directory", "/proc/x": "No such file"}
    for bad, why in refused.items():
        path = bad if bad.startswith("/") else str(tmp_path / bad)
        asked.clear()
        assert node_cli.main(["attestations", "ab", "--api", "127.0.0.1:1", "--out", path]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"open1b-node: error: cannot write --out {path}: "), err
        assert why in err, err
        # a target refused by what it is, or under a file, is refused before the node is asked
        # anything; one that does not exist yet (under /proc: it cannot be created) only on writing
        assert asked == (["/v1/attestations/ab"] if bad == "/proc/x" else [])
    assert node_cli.main(["attestations", "ab", "--api", "127.0.0.1:1", "--out", ""]) == 1
    assert capsys.readouterr().err == "open1b-node: error: --out is empty: name the file to write\n"
    # nothing half-written and nothing replaced: no temporary file left, links and the FIFO as they were
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert (tmp_path / "afile").read_text() == "kept" and stat.S_ISFIFO((tmp_path / "fifo").lstat().st_mode)
    assert all((tmp_path / name).is_symlink() for name in ("zero", "dangling", "alink"))
    assert not (tmp_path / "nothing-here").exists()
