import subprocess
from pathlib import Path

import pytest

from open1b.protocol import Identity
from open1b.protocol.hashing import blake2b256
from tests.runs import run_manifest


def ident(n: int) -> Identity:
    return Identity(blake2b256(b"node-test-identity", bytes([n])))


@pytest.fixture(scope="session")
def tampered_run(tmp_path_factory) -> tuple[Path, object]:
    """A published 6-step run whose state after step 2 is forged."""
    from open1b.deterministic.trainer import publish_run

    run_dir = tmp_path_factory.mktemp("run")
    manifest = publish_run(run_dir, ident(0), steps=6, seed=3, tamper_step=2)
    return run_dir, manifest


@pytest.fixture(scope="session")
def manifest():
    """A signed 6-step manifest with made-up state hashes (no training needed)."""

    return run_manifest(ident(0), engine="test-engine", engine_version="1", model={"d": 1}, data={}, seed=0,
                              steps=6, state_hashes=[blake2b256(b"h", bytes([k])) for k in range(7)],
                              created_at=1_800_000_000)


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 30 MiB tmpfs: a disk that fills (the suite runs as root, docs/reliability.md)."""
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=30m", "tmpfs", str(mount)], capture_output=True)
    assert done.returncode == 0, done.stderr
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def fill(mount: Path) -> Path:
    """Someone else fills the disk at ``mount`` (:func:`small_tmpfs`): a file that takes every byte
    left. Returns it: unlinking it makes the room again."""
    filler = mount / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 20))
                f.flush()
        except OSError:
            pass
    return filler
