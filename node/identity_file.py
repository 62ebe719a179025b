"""The node's key on disk: a 32-byte seed in ``<data_dir>/keystore/identity.key``.

The keystore directory is 0700 and the key file 0600, created with O_EXCL so an existing key
is never overwritten; the same seed is the libp2p host key and the attestation signer.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from open1b.protocol import Identity, Open1bError

from .files import FileRefused, read_bounded

KEYSTORE = "keystore"
KEY_FILE = "identity.key"


class KeyFileError(Open1bError):
    """The key file is missing, unreadable or malformed."""


def key_path(data_dir: Path) -> Path:
    return Path(data_dir) / KEYSTORE / KEY_FILE


def load_or_create_identity(data_dir: Path) -> Identity:
    path = key_path(data_dir)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return load_identity(data_dir)
    with os.fdopen(fd, "wb") as f:
        f.write(os.urandom(32))
        f.flush()
        os.fsync(f.fileno())
    return load_identity(data_dir)


def load_identity(data_dir: Path) -> Identity:
    """The node key; refused if others could read or replace it (as ssh refuses such keys)."""
    path = key_path(data_dir)
    try:
        seed = read_bounded(path, 64, follow=True)  # a deployment may link the key in from a secret store
        key_mode, dir_mode = os.stat(path).st_mode, os.stat(path.parent).st_mode
    except (FileRefused, OSError) as exc:
        raise KeyFileError(f"cannot read the node key: {exc}") from None
    if key_mode & 0o077:
        raise KeyFileError(f"{path} is accessible by other users (mode {stat.S_IMODE(key_mode):04o}); "
                           f"run: chmod 600 {path}")
    if dir_mode & 0o022:
        raise KeyFileError(f"{path.parent} is writable by other users (mode {stat.S_IMODE(dir_mode):04o}); "
                           f"run: chmod 700 {path.parent}")
    if len(seed) != 32:
        raise KeyFileError(f"{path} must hold exactly 32 bytes, found {len(seed)}")
    return Identity(seed)
