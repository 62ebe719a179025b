"""The node's data directory (``$OPEN1B_PATH``, default ``~/.open1b``), in the style of kubo:

    config.toml          settings (0600, written atomically)
    keystore/            0700; identity.key = the 32-byte Ed25519 seed (0600, created O_EXCL)
    version              layout version of this directory
    daemon.lock          held (flock) by the one daemon using the directory
    store.sqlite         the statement store (WAL)
    api.addr, p2p.addr   where the running daemon listens (written once listeners are up)
    api.token            the local API's token (0600, created O_EXCL): mutating routes need it
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import secrets
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from open1b.protocol import Identity, Open1bError

from .config import CONFIG_FILE, NodeConfig, load_config, split_hostport, write_config
from .files import FileRefused, read_bounded
from .identity_file import key_path, load_or_create_identity

LAYOUT_VERSION = "1"
VERSION_FILE = "version"
LOCK_FILE = "daemon.lock"
TOKEN_FILE = "api.token"
TOKEN_BYTES = 32


class DataDirError(Open1bError):
    """The data directory is missing, of another layout version, or in use by another daemon."""


def default_data_dir(value: str | None = None) -> Path:
    """``--data-dir``, else ``$OPEN1B_PATH``, else ``~/.open1b``; absolute, so that paths the daemon
    hands out (``replay RUN_ID``'s working directory) work from any directory."""
    if value is not None and not value.strip():  # not "the default": an empty --data-dir is a mistake
        raise DataDirError("--data-dir is empty")
    return Path(value or os.environ.get("OPEN1B_PATH") or Path.home() / ".open1b").expanduser().absolute()


@dataclass(frozen=True)
class InitResult:
    data_dir: Path
    peer_id: str
    created_key: bool
    wrote_config: bool


def prepare_data_dir(data_dir: Path) -> None:
    """Create ``data_dir`` (0700) if needed and check that it is a directory this process can
    write; :class:`DataDirError` with one line saying what is wrong otherwise."""
    try:
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError:
        raise DataDirError(f"data directory {data_dir} is a file, not a directory") from None
    except OSError as exc:
        raise DataDirError(f"cannot create the data directory {data_dir}: {exc.strerror}") from None
    probe = data_dir / f".write-probe.{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise DataDirError(f"data directory {data_dir} is not writable: {exc.strerror}") from None


def init_data_dir(data_dir: Path, config: NodeConfig | None = None) -> InitResult:
    """Create the directory, key, config and version file; never overwrites a key or a config."""
    data_dir = Path(data_dir)
    prepare_data_dir(data_dir)
    check_version(data_dir, create=True)
    had_key = key_path(data_dir).exists()
    identity = load_or_create_identity(data_dir)
    api_token(data_dir)
    wrote = False
    if not (data_dir / CONFIG_FILE).exists():
        write_config(config or _with_free_ports(NodeConfig(data_dir=data_dir)))
        wrote = True
    return InitResult(data_dir, identity.peer_id, not had_key, wrote)


def api_token(data_dir: Path) -> str:
    """The API token of ``data_dir``, created (0600, O_EXCL, never overwritten) if it has none.
    Whoever can read it may act on the node: it is the operator's, like the key."""
    path = Path(data_dir) / TOKEN_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return read_api_token(data_dir)
    token = secrets.token_hex(TOKEN_BYTES)
    try:
        os.write(fd, (token + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return token


def read_api_token(data_dir: Path) -> str:
    """The token a daemon of ``data_dir`` checks; :class:`DataDirError` when it is missing or not ours."""
    path = Path(data_dir) / TOKEN_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise DataDirError(f"cannot read the API token {path}: {exc.strerror}") from None
    try:
        token = os.read(fd, 2 * TOKEN_BYTES + 2).decode("ascii", errors="replace").strip()
    finally:
        os.close(fd)
    if len(token) != 2 * TOKEN_BYTES or any(c not in "0123456789abcdef" for c in token):
        raise DataDirError(f"{path} does not hold an API token (delete it and run `open1b-node init`)")
    return token


def _free_port(host: str) -> int:
    """A port nothing listens on now, picked by the kernel: nodes initialised on one machine do not
    collide, and each keeps its port across restarts (its address can go into other nodes'
    bootstrap lists). Port 0 (the daemon picks at start and writes ``p2p.addr`` / ``api.addr``)
    where the host cannot be bound now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, 0))
        except OSError:
            return 0
        return probe.getsockname()[1]


def _with_free_ports(config: NodeConfig) -> NodeConfig:
    (listen_host, _), (api_host, _) = split_hostport(config.listen), split_hostport(config.api)
    return dataclasses.replace(config, listen=f"{listen_host}:{_free_port(listen_host)}",
                               api=f"{api_host}:{_free_port(api_host)}")


def check_version(data_dir: Path, *, create: bool = False) -> None:
    path = Path(data_dir) / VERSION_FILE
    if not path.exists():
        if not create:
            raise DataDirError(f"{data_dir} is not an initialised open1b data directory (run `open1b-node init`)")
        path.write_text(LAYOUT_VERSION + "\n")
        return
    try:
        found = read_bounded(path, 64).decode(errors="replace").strip()
    except FileRefused as exc:
        raise DataDirError(f"{data_dir} is not a usable open1b data directory: {exc}") from None
    if found != LAYOUT_VERSION:
        raise DataDirError(f"{data_dir} has layout version {found!r}; this node understands {LAYOUT_VERSION!r}")


def open_data_dir(data_dir: Path) -> tuple[NodeConfig, Identity]:
    """Load an initialised directory's config and key (does not lock)."""
    check_version(data_dir)
    return load_config(data_dir), load_or_create_identity(data_dir)


class DaemonLock:
    """An exclusive, non-blocking flock on ``daemon.lock``; released when the process dies."""

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / LOCK_FILE
        self._fd: int | None = None

    def __enter__(self) -> DaemonLock:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
                os.close(fd)
                raise DataDirError(f"another daemon (pid {holder}) is using {self.path.parent}") from None
            # A stopping daemon removes the file while it holds the lock: if ours is no longer the
            # file at the path, another daemon may lock a new one there; take that one instead.
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        """Remove the lock file (a clean stop leaves nothing behind), then release the lock."""
        if self._fd is not None:
            self.path.unlink(missing_ok=True)
            os.close(self._fd)
            self._fd = None


def daemon_pid(data_dir: Path) -> int | None:
    """The pid of the daemon holding ``data_dir``'s lock, or None when no daemon does."""
    path = Path(data_dir) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise DataDirError(f"cannot open {path}: {exc.strerror}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:  # held: a daemon runs; it wrote its pid just after locking
            text = os.read(fd, 32).decode(errors="replace").strip()
            if not text.isdigit():
                raise DataDirError(f"a daemon holds {path} but has not written its pid yet; try again") from None
            return int(text)
        return None
    finally:
        os.close(fd)


def stop_daemon(data_dir: Path, *, timeout_s: float = 60.0, poll_s: float = 0.1) -> int:
    """Send SIGTERM to the daemon using ``data_dir`` and wait until it has released the lock (a
    clean stop: components stopped, address and lock files removed). Returns its pid."""
    pid = daemon_pid(data_dir)
    if pid is None:
        raise DataDirError(f"no running daemon found for {data_dir}")
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        raise DataDirError(f"the daemon of {data_dir} (pid {pid}) is gone, yet its lock is held") from None
    deadline = time.monotonic() + timeout_s
    while daemon_pid(data_dir) is not None:
        if time.monotonic() > deadline:
            raise DataDirError(f"the daemon (pid {pid}) is still running {timeout_s:.0f} s after SIGTERM; "
                               f"if it is stuck: kill -9 {pid}")
        time.sleep(poll_s)
    return pid
