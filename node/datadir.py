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

import fcntl
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from open1b.protocol import Identity, Open1bError

from .config import CONFIG_FILE, NodeConfig, load_config, write_config
from .identity_file import key_path, load_or_create_identity

LAYOUT_VERSION = "1"
VERSION_FILE = "version"
LOCK_FILE = "daemon.lock"
TOKEN_FILE = "api.token"
TOKEN_BYTES = 32


class DataDirError(Open1bError):
    """The data directory is missing, of another layout version, or in use by another daemon."""


def default_data_dir(value: str | None = None) -> Path:
    return Path(value or os.environ.get("OPEN1B_PATH") or Path.home() / ".open1b").expanduser()


@dataclass(frozen=True)
class InitResult:
    data_dir: Path
    peer_id: str
    created_key: bool
    wrote_config: bool


def init_data_dir(data_dir: Path, config: NodeConfig | None = None) -> InitResult:
    """Create the directory, key, config and version file; never overwrites a key or a config."""
    data_dir = Path(data_dir)
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_version(data_dir, create=True)
    had_key = key_path(data_dir).exists()
    identity = load_or_create_identity(data_dir)
    api_token(data_dir)
    wrote = False
    if not (data_dir / CONFIG_FILE).exists():
        write_config(config or NodeConfig(data_dir=data_dir))
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


def check_version(data_dir: Path, *, create: bool = False) -> None:
    path = Path(data_dir) / VERSION_FILE
    if not path.exists():
        if not create:
            raise DataDirError(f"{data_dir} is not an initialised open1b data directory (run `open1b-node init`)")
        path.write_text(LAYOUT_VERSION + "\n")
        return
    found = path.read_text().strip()
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
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise DataDirError(f"another daemon (pid {holder}) is using {self.path.parent}") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
