"""``open1b-node publish --move`` against a real daemon (issue 29 item 4): the run's files are
renamed into the daemon's blob cache, gone from the directory, and served to a second daemon that
fetches and replays every step; a run the daemon refuses has every file moved back, unchanged."""

import json
import os
import shutil

import pytest

from open1b.devnet import Daemons
from open1b.node.blobs import file_digest
from open1b.node.client import call
from open1b.node.runs import run_blobs

from .commands import cli, wait_for

pytestmark = pytest.mark.integration


def snapshot(run_dir) -> dict:
    return {p.relative_to(run_dir): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def network(tmp_path_factory, tampered_run):
    source, _ = tampered_run
    workdir = tmp_path_factory.mktemp("move")  # one filesystem for the runs and the data dirs: a move renames
    daemons = Daemons(workdir, source, redundancy=1)
    addrs = daemons.plan(2)
    daemons.start(0, audit=False, bootstrap=[addrs[1]], extra_args=("--no-spot-checks",))  # publishes
    daemons.start(1, audit=True, bootstrap=[addrs[0]], extra_args=("--no-spot-checks",))  # fetches from it
    try:
        for index in range(2):
            daemons.api(index)  # up: its API address written
        yield workdir, daemons
    finally:
        daemons.stop()


def test_a_refused_move_puts_every_file_back(network, tampered_run):
    """First: the run is not yet the daemon's, so the refusal is the file's alone."""
    source, manifest = tampered_run
    workdir, daemons = network
    run_dir = workdir / "run-refused"
    shutil.copytree(source, run_dir)
    last = run_dir / run_blobs(manifest)[-1].relpath
    data = bytearray(last.read_bytes())
    data[-1] ^= 1  # the last file checked is not the one the manifest names
    last.write_bytes(bytes(data))
    before = snapshot(run_dir)
    rc, out, err = cli("publish", str(run_dir), "--data-dir", str(daemons.dirs[0]), "--move", "--json")
    assert rc != 0 and "hash" in err, (rc, out, err)
    assert snapshot(run_dir) == before  # every file moved back, unchanged
    assert not [p for p in (daemons.dirs[0] / "blobs").rglob("*") if p.is_file()]  # and none kept


def test_moved_files_leave_the_directory_and_are_served(network, tampered_run):
    source, manifest = tampered_run
    workdir, daemons = network
    run_dir = workdir / "run-moved"
    shutil.copytree(source, run_dir)
    inodes = {b.digest: os.stat(run_dir / b.relpath).st_ino for b in run_blobs(manifest)}
    rc, out, err = cli("publish", str(run_dir), "--data-dir", str(daemons.dirs[0]), "--move", "--json")
    assert rc == 0, err
    job = json.loads(out)
    assert job["moved"] and job["run"] == manifest.run_id.hex()
    assert [p.name for p in run_dir.rglob("*") if p.is_file()] == ["manifest.cbor"]  # no second copy
    blobs = daemons.dirs[0] / "blobs"
    held = {p.stat().st_ino: p for p in blobs.rglob("*") if p.is_file()}
    for blob in run_blobs(manifest):  # the same files, renamed: their inodes are in the cache
        assert file_digest(held[inodes[blob.digest]]) == blob.digest
    # served: the auditor, which never saw the directory, fetches every step's files and replays them
    api = daemons.api(1)
    wait_for(lambda: call(api, f"/v1/coverage/{job['run']}")["complete"], 300, what="the auditor's coverage")
    status = call(api, "/v1/status")
    assert status["replays"] == manifest.steps and status["blobs"]["fetched_bytes"] > 0
