"""A blob in use is never evicted, however small the cache's bound: fetched and not yet linked
(held), or linked into a working directory. The one-step gpt-1b devnet found this: its auditor
fetched checkpoints 0 and 1 (11 GB each, against the default 8 GiB bound); the adoption of each
evicted it again at once, and the daemon died reading the fetched file's size."""

from __future__ import annotations

import os

import trio

from open1b.node.blobs import BLOB_PROTOCOL, MAX_CHUNK, BlobCache, file_digest
from open1b.node.p2p import open_p2p
from open1b.node.runs import RunFiles, checkpoint_blob

from .conftest import ident


def test_checkpoints_larger_than_the_bound_are_kept_while_used_and_evicted_after(tmp_path, tampered_run):
    run_dir, manifest = tampered_run
    blobs = [checkpoint_blob(manifest, k) for k in (0, 1)]

    async def main():
        with trio.fail_after(60):
            async with open_p2p(ident(72), "127.0.0.1", 0) as fetcher, open_p2p(ident(73), "127.0.0.1", 0) as server:
                served = RunFiles(tmp_path / "server", BlobCache(tmp_path / "server" / "blobs", 1 << 30))
                await served.import_dir(manifest, run_dir)
                server.set_stream_handler(BLOB_PROTOCOL, served.cache.serve)
                await fetcher.connect(server.addrs[0])
                # a bound smaller than either checkpoint, as 8 GiB is for a 1B model's
                files = RunFiles(tmp_path / "fetcher", BlobCache(tmp_path / "fetcher" / "blobs", 1000))
                paths = {}

                async def fetch(blob):
                    paths[blob.name] = await files.fetch(fetcher, blob, lambda peer: None, provide=lambda key: None)

                async with trio.open_nursery() as nursery:  # as a spot check fetches k and k+1
                    for blob in blobs:
                        nursery.start_soon(fetch, blob)
                for blob in blobs:  # both still there after the other's adoption evicted
                    assert file_digest(paths[blob.name]) == blob.digest
                work = files.assemble(manifest, blobs)
                for blob in blobs:
                    assert file_digest(work / blob.relpath) == blob.digest
                # linked, not held: a later adoption's eviction passes them over
                other = tmp_path / "other"
                other.write_bytes(os.urandom(MAX_CHUNK))
                files.cache.add_file(other)
                assert all(files.cache.has(b.digest) for b in blobs)
                files.release(manifest, blobs[:1])  # checkpoint 0 no longer in use: evicted
                assert not files.cache.has(blobs[0].digest) and files.cache.has(blobs[1].digest)
                files.release(manifest, blobs[1:])
                assert not files.cache.has(blobs[1].digest)

    trio.run(main)


def test_a_held_blob_is_kept_and_goes_once_unheld(tmp_path):
    cache = BlobCache(tmp_path / "cache", max_bytes=1500)
    first = tmp_path / "first"
    first.write_bytes(b"\x01" * 1000)
    digest = cache.add_file(first)
    cache.hold(digest)
    second = tmp_path / "second"
    second.write_bytes(b"\x02" * 1000)
    kept = cache.add_file(second)
    assert cache.has(digest) and cache.has(kept)  # over the bound: both in use
    cache.unhold(digest)
    cache.evict()
    assert not cache.has(digest) and cache.has(kept)
