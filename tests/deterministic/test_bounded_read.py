"""The engine reads a run directory someone else wrote (a trainer's, a caller's, one assembled from
peers' blobs) bounded: a manifest, checkpoint, samples or fingerprints file that is a symlink (to
``/dev/zero``), a FIFO or larger than its limit is refused before a byte is read, with the error
the engine's callers already handle — never a hang, a memory spike or a traceback."""

from __future__ import annotations

import os
import shutil

import pytest

from open1b.deterministic.bounded_read import FileRefused, read_bounded
from open1b.deterministic.errors import RunFormatError, SamplesFormatError
from open1b.deterministic.provenance import load_run_samples
from open1b.deterministic.replay import replay
from open1b.deterministic.runfile import MANIFEST_FILE, SAMPLES_FILE, checkpoint_path, load_checkpoint, read_manifest
from open1b.deterministic.spot_run import SpotInputError, load_fingerprints
from open1b.deterministic.trainer import config_of, publish_run
from open1b.protocol import Identity
from open1b.protocol.fingerprints import FINGERPRINTS_FILE
from open1b.protocol.messages import MAX_MANIFEST_SIZE


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    return run_dir, publish_run(run_dir, Identity(bytes(range(32))), steps=2, seed=3)


def _hostile(path, kind: str, size: int = 0) -> None:
    path.unlink()
    if kind == "symlink to /dev/zero":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    else:  # sparse: no disk, and reading it whole would take its size in memory
        with open(path, "wb") as f:
            f.truncate(size)


@pytest.mark.parametrize("kind", ["symlink to /dev/zero", "fifo", "oversized"])
def test_each_file_of_a_run_is_refused_before_it_is_read(run, tmp_path, kind):
    run_dir, manifest = run
    config, _ = config_of(manifest)
    cases = [
        (MANIFEST_FILE, MAX_MANIFEST_SIZE + 1, RunFormatError, lambda d: read_manifest(d)),
        (str(checkpoint_path(run_dir, 1).relative_to(run_dir)), 1 << 40, RunFormatError,
         lambda d: load_checkpoint(d, 1, config)),
        (SAMPLES_FILE, 1 << 40, SamplesFormatError, lambda d: load_run_samples(d, manifest)),
        (FINGERPRINTS_FILE, 1 << 40, SpotInputError, lambda d: load_fingerprints(d, manifest)),
    ]
    for i, (name, size, error, read) in enumerate(cases):
        copy = tmp_path / f"run-{i}"
        shutil.copytree(run_dir, copy)
        _hostile(copy / name, kind, size)
        with pytest.raises(error, match="symbolic link" if kind.startswith("symlink") else
                           "not a regular file" if kind == "fifo" else "more than the"):
            read(copy)
    copy = tmp_path / "replayed"
    shutil.copytree(run_dir, copy)
    _hostile(copy / MANIFEST_FILE, kind, MAX_MANIFEST_SIZE + 1)
    with pytest.raises(RunFormatError, match="no run at"):
        replay(copy, 0)


def test_read_bounded_reads_up_to_its_limit_and_names_what_it_refused(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 10)
    assert read_bounded(path, 10) == b"x" * 10
    with pytest.raises(FileRefused, match="more than the 9 allowed"):
        read_bounded(path, 9)
    with pytest.raises(FileRefused, match="No such file"):
        read_bounded(tmp_path / "missing", 9)
