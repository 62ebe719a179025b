"""Publishing without a second copy (issue 29 item 4): ``import_dir(move=True)`` renames a run's
files into the blob cache and hashes them there; a run refused moves back whole; another
filesystem or a hard-linked file is refused before anything moves. And a large file is checked
streamed: bounded memory, progress as it goes."""

from __future__ import annotations

import os
import shutil
import tracemalloc

import pytest
import trio

from open1b.node.blobs import PROGRESS_BYTES, BlobCache, BlobError, file_digest
from open1b.node.runs import RunFiles, RunFilesError, run_blobs


def snapshot(run_dir) -> dict:
    return {p.relative_to(run_dir): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def test_a_moved_run_is_the_caches_and_its_directory_keeps_only_the_manifest(tmp_path, tampered_run):
    source, manifest = tampered_run
    run_dir = tmp_path / "run"
    shutil.copytree(source, run_dir)
    before = snapshot(run_dir)
    inodes = {b.digest: os.stat(run_dir / b.relpath).st_ino for b in run_blobs(manifest)}
    cache = BlobCache(tmp_path / "data" / "blobs", 1 << 30)
    notes = []
    moved = trio.run(lambda: RunFiles(tmp_path / "data", cache).import_dir(
        manifest, run_dir, lambda done, total, note: notes.append(note), move=True))
    assert moved == sum(len(data) for path, data in before.items() if path.name != "manifest.cbor")
    for blob in run_blobs(manifest):
        assert not (run_dir / blob.relpath).exists()  # renamed, not copied: no second copy on disk
        kept = cache.path(blob.digest)
        assert kept.stat().st_ino == inodes[blob.digest] and kept.stat().st_nlink == 1
        assert file_digest(kept) == blob.digest and blob.digest in cache.pinned
    assert [p.name for p in run_dir.rglob("*") if p.is_file()] == ["manifest.cbor"]
    assert notes[-1] == "checked"


def test_a_refused_run_moves_back_whole(tmp_path, tampered_run):
    source, manifest = tampered_run
    run_dir = tmp_path / "run"
    shutil.copytree(source, run_dir)
    last = run_blobs(manifest)[-1]
    data = bytearray((run_dir / last.relpath).read_bytes())
    data[-1] ^= 1
    (run_dir / last.relpath).write_bytes(bytes(data))  # the last file checked is not the manifest's
    before = snapshot(run_dir)
    cache = BlobCache(tmp_path / "data" / "blobs", 1 << 30)
    with pytest.raises(RunFilesError, match="do not hash to the manifest's address"):
        trio.run(lambda: RunFiles(tmp_path / "data", cache).import_dir(manifest, run_dir, move=True))
    assert snapshot(run_dir) == before
    assert not [p for p in cache.dir.iterdir() if p.is_file()]


def test_a_move_across_filesystems_or_of_a_linked_file_is_refused_before_anything_moves(tmp_path, tampered_run,
                                                                                          small_tmpfs):
    source, manifest = tampered_run
    run_dir = tmp_path / "run"
    shutil.copytree(source, run_dir)
    before = snapshot(run_dir)
    with pytest.raises(RunFilesError, match="another filesystem .*publish without --move copies it"):
        trio.run(lambda: RunFiles(small_tmpfs, BlobCache(small_tmpfs / "blobs", 1 << 30)).import_dir(
            manifest, run_dir, move=True))
    assert snapshot(run_dir) == before
    # a second name for a checkpoint would let its owner change the blob after the check
    os.link(run_dir / run_blobs(manifest)[2].relpath, tmp_path / "second-name")
    with pytest.raises(RunFilesError, match="one name"):
        trio.run(lambda: RunFiles(tmp_path / "data", BlobCache(tmp_path / "data" / "blobs", 1 << 30)).import_dir(
            manifest, run_dir, move=True))
    assert snapshot(run_dir) == before


def test_a_large_file_is_hashed_in_bounded_memory_with_progress(tmp_path):
    """A 600 MiB file (sparse: no disk) moved into the cache: hashed 1 MiB at a time, never whole."""
    size = 600 << 20
    big = tmp_path / "big"
    with open(big, "wb") as f:
        f.truncate(size)
    digest = file_digest(big)
    cache = BlobCache(tmp_path / "blobs", 1 << 40)
    progress = []
    tracemalloc.start()
    try:
        staged = cache.move_in(big, digest, on_bytes=progress.append)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak  # a few 1 MiB reads, not 600 MiB
    assert progress == [PROGRESS_BYTES, 2 * PROGRESS_BYTES]
    assert not big.exists() and staged.stat().st_size == size
    cache.commit(staged, digest)
    assert cache.has(digest)
    # a file that is not the address named is renamed back, untouched
    other = tmp_path / "other"
    other.write_bytes(b"not it")
    with pytest.raises(BlobError, match="do not hash"):
        cache.move_in(other, digest[::-1])
    assert other.read_bytes() == b"not it"


def test_a_moved_run_is_answered_from_links_to_the_cache(tmp_path, tampered_run):
    """After a move the trainer's directory holds no checkpoints: the run is stored with a working
    directory of links to the verified blobs, from which spot-check answers are computed."""
    from open1b.node.clock import Clock
    from open1b.node.jobs import JobState
    from open1b.node.publisher import Publisher

    source, manifest = tampered_run
    run_dir = tmp_path / "run"
    shutil.copytree(source, run_dir)
    cache = BlobCache(tmp_path / "data" / "blobs", 1 << 30)
    stored = {}

    class Statements:
        async def add_run(self, manifest, run_dir):
            stored[manifest.run_id] = run_dir

    class P2P:
        async def provide(self, key):
            return True

        def connected_peers(self):
            return []

    bootstrapped = trio.Event()
    bootstrapped.set()
    publisher = Publisher(Statements(), RunFiles(tmp_path / "data", cache), P2P(), bootstrapped=bootstrapped,
                          clock=Clock())

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(publisher.serve_publisher)
            job = await publisher.publish_dir(run_dir, move=True)
            with trio.fail_after(60):
                while not job.state.finished:
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
        return job

    job = trio.run(main)
    assert job.state == JobState.DONE and job.moved and job.as_json()["moved"] is True, job.error
    served = stored[manifest.run_id]
    assert served != run_dir.resolve() and served.is_relative_to(tmp_path / "data")
    for blob in run_blobs(manifest):
        assert (served / blob.relpath).stat().st_ino == cache.path(blob.digest).stat().st_ino
