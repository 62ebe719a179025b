"""write_atomic, the one implementation the engine and the node share: the new bytes are fsynced
before the rename and the directory after it (so the rename survives a power cut too), and a
failure leaves the old file and no temporary file behind."""

import os
import stat

import pytest

from open1b.deterministic import durable_write
from open1b.deterministic.durable_write import write_atomic


def _record(monkeypatch, path):
    """What happens to ``path`` and its directory, in order: ("fsync", the inode of the file
    fsynced | "dir"), ("replace", name)."""
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            assert st.st_ino == os.stat(path.parent).st_ino
            events.append(("fsync", "dir"))
        else:
            events.append(("fsync", st.st_ino))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", os.path.basename(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(durable_write.os, "fsync", fsync)
    monkeypatch.setattr(durable_write.os, "replace", replace)
    return events


def test_the_file_is_fsynced_before_the_rename_and_the_directory_after(tmp_path, monkeypatch):
    path = tmp_path / "run" / "manifest.cbor"  # the directory is created
    events = _record(monkeypatch, path)
    write_atomic(path, b"first")
    # the file fsynced is the one now at ``path``
    assert events == [("fsync", path.stat().st_ino), ("replace", "manifest.cbor"), ("fsync", "dir")]
    events.clear()
    write_atomic(path, b"second", mode=0o600)
    assert events == [("fsync", path.stat().st_ino), ("replace", "manifest.cbor"), ("fsync", "dir")]
    assert path.read_bytes() == b"second" and os.listdir(path.parent) == ["manifest.cbor"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "config.toml"
    write_atomic(path, b"old", mode=0o600)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600

    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(durable_write.os, "fsync", full)
    with pytest.raises(OSError):
        write_atomic(path, b"new")
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["config.toml"]


def test_there_is_one_implementation():
    from open1b.deterministic import data_index, runfile, samples
    from open1b.node import files

    assert files.write_atomic is runfile.write_atomic is samples.write_atomic is data_index.write_atomic \
        is write_atomic
