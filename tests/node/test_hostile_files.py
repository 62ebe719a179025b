"""Files a caller names (issue 15): a run directory whose manifest or checkpoints are symlinks,
FIFOs, devices or sparse giants is refused at once, without blocking the event loop, filling
memory or revealing what the daemon could read; published blobs are the node's own copies."""

from __future__ import annotations

import dataclasses
import os
import resource
import shutil
import subprocess

import pytest
import trio

from open1b.deterministic.runfile import MANIFEST_FILE, checkpoint_path
from open1b.node.api import ApiError
from open1b.node.blobs import BlobCache, file_digest
from open1b.node.files import FileRefused, StorageFull, read_bounded
from open1b.node.publisher import read_run_manifest_async
from open1b.node.runs import RunFiles, RunFilesError, checkpoint_blob, run_blobs, samples_blob
from open1b.node.store import Store
from open1b.protocol.hashing import blake2b256

from .conftest import fill


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_read_bounded_refuses_devices_fifos_symlinks_and_giants(tmp_path):
    (tmp_path / "zero").symlink_to("/dev/zero")
    with pytest.raises(FileRefused, match="symbolic link"):
        read_bounded(tmp_path / "zero", 1 << 20)
    with pytest.raises(FileRefused, match="not a regular file"):
        read_bounded(tmp_path / "zero", 1 << 20, follow=True)  # followed: still a device
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(FileRefused, match="not a regular file"):  # no writer: a blocking open would hang here
        read_bounded(tmp_path / "fifo", 1 << 20)
    with open(tmp_path / "sparse", "wb") as f:
        f.truncate(1 << 30)
    before = _peak_rss_mb()
    with pytest.raises(FileRefused, match=f"{1 << 30} bytes, more than"):
        read_bounded(tmp_path / "sparse", 1 << 20)
    assert _peak_rss_mb() - before < 64  # refused by fstat, not after reading a gigabyte
    with pytest.raises(FileRefused, match="not a regular file"):
        read_bounded(tmp_path, 10)
    with pytest.raises(FileRefused, match="No such file"):
        read_bounded(tmp_path / "absent", 10)
    (tmp_path / "ok").write_bytes(b"12345")
    assert read_bounded(tmp_path / "ok", 5) == b"12345"
    with pytest.raises(FileRefused, match="more than the 4 allowed"):
        read_bounded(tmp_path / "ok", 4)


def test_manifest_read_off_the_event_loop_and_refused(tmp_path):
    """The daemon's publish path: a FIFO or /dev/zero as manifest.cbor is a 400 at once, and the
    event loop keeps running meanwhile (before: the FIFO froze the whole daemon)."""
    fifo_run, zero_run = tmp_path / "fifo", tmp_path / "zero"
    fifo_run.mkdir()
    zero_run.mkdir()
    os.mkfifo(fifo_run / MANIFEST_FILE)
    (zero_run / MANIFEST_FILE).symlink_to("/dev/zero")

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await trio.sleep(0.001)

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(ticker)
                for run in (fifo_run, zero_run):
                    with pytest.raises(ApiError) as caught:
                        await read_run_manifest_async(run, 0)
                    assert caught.value.status == 400 and "refused" in str(caught.value)
                nursery.cancel_scope.cancel()
        assert ticks > 0

    trio.run(main)


def test_symlinked_checkpoint_refused_without_revealing_its_target(tmp_path, tampered_run):
    run_dir, manifest = tampered_run
    secret = tmp_path / "secret"
    secret.write_bytes(b"the daemon can read this; the caller cannot")
    hostile = tmp_path / "hostile"
    shutil.copytree(run_dir, hostile)
    checkpoint_path(hostile, 2).unlink()
    checkpoint_path(hostile, 2).symlink_to(secret)
    files = RunFiles(tmp_path / "data", BlobCache(tmp_path / "data" / "blobs", 1 << 30))
    with pytest.raises(RunFilesError, match="checkpoint 2: .*symbolic link") as caught:
        trio.run(files.import_dir, manifest, hostile)
    assert blake2b256(secret.read_bytes()).hex()[:16] not in str(caught.value)
    assert not any((tmp_path / "data" / "blobs").iterdir())  # nothing imported

    # a wrong regular file: the message names the manifest's address, never the hash of what was read
    checkpoint_path(hostile, 2).unlink()
    shutil.copy(secret, checkpoint_path(hostile, 2))
    with pytest.raises(RunFilesError, match="do not hash to the manifest's address") as caught:
        trio.run(files.import_dir, manifest, hostile)
    assert blake2b256(secret.read_bytes()).hex()[:16] not in str(caught.value)


def test_published_blobs_are_copies_and_changes_on_disk_are_caught(tmp_path, tampered_run):
    run_dir, manifest = tampered_run
    trainer = tmp_path / "trainer"
    shutil.copytree(run_dir, trainer)
    cache = BlobCache(tmp_path / "data" / "blobs", 1 << 30)
    files = RunFiles(tmp_path / "data", cache)
    trio.run(files.import_dir, manifest, trainer)
    mtimes = [checkpoint_path(trainer, k).stat().st_mtime_ns for k in range(manifest.steps + 1)]
    blob = checkpoint_blob(manifest, 1)
    kept = cache.path(blob.digest)
    assert kept.stat().st_ino != checkpoint_path(trainer, 1).stat().st_ino and kept.stat().st_nlink == 1

    # the trainer edits its checkpoint after publishing: the node's blob is unchanged
    with open(checkpoint_path(trainer, 1), "r+b") as f:
        f.seek(100)
        f.write(b"\xff" * 8)
    assert file_digest(kept) == blob.digest

    async def serve_and_evict():
        assert await cache.open_verified(blob.digest) == kept
        cache.max_bytes = 0
        cache.evict()  # pinned: kept; and the cache touched nothing outside its directory
        assert kept.exists()
        # the operator (or a disk) changes a cached blob: hashed again before serving, and dropped
        with open(kept, "r+b") as f:
            f.seek(100)
            f.write(b"\x00" * 8)
        os.utime(kept, ns=(1, 1))
        assert await cache.open_verified(blob.digest) is None
        assert not kept.exists()

    trio.run(serve_and_evict)
    mtimes[1] = checkpoint_path(trainer, 1).stat().st_mtime_ns  # the trainer's own edit
    assert [checkpoint_path(trainer, k).stat().st_mtime_ns for k in range(manifest.steps + 1)] == mtimes

    # a later publish of a directory whose file is not the manifest's is refused, even though the
    # cache holds that blob already
    with pytest.raises(RunFilesError, match="checkpoint 1: .*do not hash"):
        trio.run(files.import_dir, manifest, trainer)


def test_disk_full_import_fails_cleanly_and_leaves_nothing(tmp_path, tampered_run, small_tmpfs):
    run_dir, manifest = tampered_run
    cache = BlobCache(small_tmpfs / "blobs", 1 << 30)
    files = RunFiles(small_tmpfs, cache)
    # the free-space check against the manifest's sizes, with a reserve, refuses before copying
    cache.reserve_bytes = 30 << 20
    with pytest.raises(StorageFull, match="reserve"):
        trio.run(files.import_dir, manifest, run_dir)
    assert not any(cache.dir.iterdir())
    # a disk that fills while copying (the check passed, then someone else took the space)
    cache.reserve_bytes = 0
    big = tmp_path / "big"
    big.write_bytes(os.urandom(40 << 20))
    with pytest.raises(StorageFull, match="no space left"):
        cache.stage(big, blake2b256(b"whatever"))
    assert not any(cache.dir.iterdir())  # the partial copy is gone
    # and once there is room, the same import succeeds
    assert trio.run(files.import_dir, manifest, run_dir) == sum(
        os.path.getsize(run_dir / b.relpath) for b in run_blobs(manifest))


def test_store_on_a_full_disk_degrades_to_read_only(small_tmpfs):
    store = Store(small_tmpfs / "store.sqlite")
    run = bytes(32)
    store.add_replay_witness(run, 0, bytes(32))
    filler = fill(small_tmpfs)
    # each write fails cleanly (no sqlite3 exception escapes); reads keep working
    kept = [store.add_replay_witness(run, step, os.urandom(32) * 64) for step in range(1, 400)]
    assert store.full and not all(kept)
    assert store.replay_witnesses(run)[0] == bytes(32)
    filler.unlink()
    store.add_replay_witness(run, 1000, bytes(32))
    assert not store.full and 1000 in store.replay_witnesses(run)
    store.close()


def test_doctor_fails_a_read_only_data_dir_and_explains_untrusted_attesters(tmp_path):
    from open1b.node.doctor import run_checks

    ro = tmp_path / "ro"
    ro.mkdir()
    assert subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)]).returncode == 0
    try:
        coverage = {"run": "ab" * 32, "untrusted": ["12D3KooWpeer"], "policy": {"roots": ["me"], "earned": []}}
        checks = {c.name: c for c in run_checks(ro, None, "cpu", coverages=[coverage])}
    finally:
        subprocess.run(["umount", "-l", str(ro)], check=True)
    assert checks["writable"].level == "FAIL" and "not writable" in checks["writable"].detail
    assert checks["disk"].level == "FAIL"  # 1 MiB free: below the minimum
    # the doctor's own 2 GiB minimum decides here, not disk_reserve_bytes (256 MiB by default): say so
    assert "doctor's minimum" in checks["disk"].detail and "the reserve" not in checks["disk"].detail
    assert checks["trust"].level == "WARN" and "open1b-node trust add 12D3KooWpeer" in checks["trust"].detail


def test_assemble_streams_a_copy_across_filesystems_and_a_full_disk_leaves_nothing(tmp_path, tampered_run, small_tmpfs):
    """The working directory on another filesystem than the blob cache (no hard link possible):
    the blob is copied without being read whole (peak Python memory stays near one COPY_CHUNK),
    and a disk that fills during the copy ends as "no space left", with no partial file left."""
    import tracemalloc

    from open1b.node.runs import COPY_CHUNK, RunBlob, checkpoint_relpath

    _, manifest = tampered_run
    cache = BlobCache(tmp_path / "blobs", 1 << 34)
    blobs = []
    for i in range(2):  # 2 × 18 MiB: the first fits on the 30 MiB tmpfs, the second does not
        source = tmp_path / f"blob{i}"
        source.write_bytes(os.urandom(18 << 20))
        blobs.append(RunBlob(f"checkpoint {i}", checkpoint_relpath(i), cache.add_file(source), 18 << 20, 1 << 34))
    files = RunFiles(small_tmpfs, cache)
    tracemalloc.start()
    try:
        work = files.assemble(manifest, blobs[:1])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * COPY_CHUNK, f"assemble held {peak} bytes at once"  # before: the whole 18 MiB blob
    assert file_digest(work / blobs[0].relpath) == blobs[0].digest
    assert os.stat(work / blobs[0].relpath).st_dev != os.stat(cache.path(blobs[0].digest)).st_dev  # a copy
    with pytest.raises(RunFilesError, match="checkpoint 1: no space left"):
        files.assemble(manifest, blobs[1:])
    leftovers = [p.name for p in (work / blobs[1].relpath).parent.iterdir()]
    assert leftovers == [os.path.basename(blobs[0].relpath)]


def _samples_to_assemble(tmp_path, manifest, data_dir):
    """RunFiles over ``data_dir`` with a cache (outside it) holding a samples blob of ``manifest``,
    and that blob: what a working directory on ``data_dir`` is assembled from."""
    cache = BlobCache(tmp_path / "blobs", 1 << 30)
    samples = tmp_path / "samples"
    samples.write_bytes(os.urandom(1000))
    return RunFiles(data_dir, cache), dataclasses.replace(samples_blob(manifest), digest=cache.add_file(samples))


def test_assemble_on_a_full_disk_is_a_run_files_error_not_a_crash(tmp_path, tampered_run, small_tmpfs):
    """A full disk when a run's working directory is first written (its manifest) is the
    RunFilesError "no space left" that the auditor and the spot checker retry later: it was a bare
    OSError, which no caller catches, so it ended the auditor's task and the daemon with it."""
    _, manifest = tampered_run
    files, blob = _samples_to_assemble(tmp_path, manifest, small_tmpfs)
    filler = fill(small_tmpfs)
    with pytest.raises(RunFilesError, match="the manifest: no space left"):
        files.assemble(manifest, [blob])
    work = files.work_dir(manifest.run_id)
    assert not work.exists() or list(work.iterdir()) == []  # no half-written manifest
    filler.unlink()  # with room again, the same call succeeds
    assert file_digest(files.assemble(manifest, [blob]) / blob.relpath) == blob.digest


def test_assemble_on_a_read_only_remount_is_a_run_files_error_not_a_crash(tmp_path, tampered_run, small_tmpfs):
    """The data dir's disk remounted read-only under a running node: the same retry-later
    RunFilesError as a full disk, where the bare OSError would have ended the auditor's task."""
    _, manifest = tampered_run
    files, blob = _samples_to_assemble(tmp_path, manifest, small_tmpfs)
    subprocess.run(["mount", "-o", "remount,ro", str(small_tmpfs)], check=True)
    try:
        with pytest.raises(RunFilesError, match="the manifest: cannot write it to .*: Read-only file system"):
            files.assemble(manifest, [blob])
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(small_tmpfs)], check=True)
    assert file_digest(files.assemble(manifest, [blob]) / blob.relpath) == blob.digest  # writable again: it works


def test_publish_refuses_a_symlinked_run_directory_or_checkpoints_directory(tmp_path, tampered_run):
    """Files in a run directory are opened without following a link in their last component; a
    linked run directory or checkpoints/ would still take every one of them elsewhere."""
    from open1b.node.clock import Clock
    from open1b.node.publisher import Publisher

    run_dir, _ = tampered_run
    linked_run = tmp_path / "linked-run"
    linked_run.symlink_to(run_dir)
    linked_checkpoints = tmp_path / "linked-checkpoints"
    linked_checkpoints.mkdir()
    for name in ("manifest.cbor", "samples.bin", "fingerprints.cbor"):
        if (run_dir / name).exists():
            shutil.copy(run_dir / name, linked_checkpoints / name)
    (linked_checkpoints / "checkpoints").symlink_to(run_dir / "checkpoints")
    publisher = Publisher(None, None, None, bootstrapped=trio.Event(), clock=Clock())

    async def publish(path):
        return await publisher.publish_dir(path)

    for path, said in ((linked_run, "the run directory is a symbolic link"),
                       (linked_checkpoints, "its checkpoints/ is a symbolic link")):
        with pytest.raises(ApiError) as refused:
            trio.run(publish, path)
        assert refused.value.status == 400 and said in str(refused.value) and "\n" not in str(refused.value)
    with pytest.raises(RuntimeError, match="before serve_publisher"):  # the directory itself: past the checks
        trio.run(publish, run_dir)
