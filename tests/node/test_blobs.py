"""Blob transfer between real py-libp2p hosts on loopback: located through DHT provider records,
chunked, resumable, verified before use, cached with a bound."""

import dataclasses
import os
from contextlib import AsyncExitStack

import pytest
import trio

from open1b.deterministic.config import PRESETS
from open1b.deterministic.runfile import checkpoint_path, save_checkpoint
from open1b.deterministic.state import init_state
from open1b.node.blobs import BLOB_PROTOCOL, MAX_CHUNK, BlobCache, BlobError, file_digest, provider_key
from open1b.node.chunk_table import ChunkTableError, compute_table
from open1b.node.p2p import open_p2p
from open1b.protocol.codec import encode

from .conftest import ident


def test_fetch_verify_resume_and_reject_lies(tmp_path):
    payload = os.urandom(2 * MAX_CHUNK + 12345)
    source = tmp_path / "checkpoint.bin"
    source.write_bytes(payload)

    async def main():
        with trio.fail_after(60):
            async with AsyncExitStack() as stack:
                a, b, c = [await stack.enter_async_context(open_p2p(ident(40 + i), "127.0.0.1", 0)) for i in range(3)]
                cache_a, cache_c = BlobCache(tmp_path / "a", 1 << 30), BlobCache(tmp_path / "c", 1 << 30)
                a.set_stream_handler(BLOB_PROTOCOL, cache_a.serve)
                digest = cache_a.add_file(source, pin=True)
                for node in (b, c):
                    await node.connect(a.addrs[0])
                await c.connect(b.addrs[0])
                assert await a.provide(provider_key(digest))
                providers = await c.find_providers(provider_key(digest))
                assert providers == [a.peer_id]

                # resume: half a chunk already on disk from an interrupted download
                cache_c.path(digest).with_suffix(".partial").write_bytes(payload[: MAX_CHUNK // 2])
                seen = []
                path = await cache_c.fetch(c, digest, providers, progress=lambda done, total: seen.append(done))
                assert path.read_bytes() == payload and file_digest(path) == digest
                assert seen[0] == MAX_CHUNK // 2 + MAX_CHUNK  # continued from the partial file

                # a provider that serves other bytes: the download fails and nothing is kept
                async def liar(stream):
                    while True:
                        await stream.receive(128)
                        await stream.send(encode({"size": 10}))
                        await stream.send(b"0123456789")

                b.set_stream_handler(BLOB_PROTOCOL, liar)
                other = os.urandom(32)
                with pytest.raises(BlobError, match="do not hash"):
                    await BlobCache(tmp_path / "d", 1 << 30).fetch(c, other, [b.peer_id])
                assert not list((tmp_path / "d").iterdir())
                # an unknown blob is a typed error naming every provider tried
                with pytest.raises(BlobError, match=a.peer_id):
                    await BlobCache(tmp_path / "e", 1 << 30).fetch(c, other, [a.peer_id])

    trio.run(main)


def test_a_bug_of_ours_during_a_fetch_is_not_the_providers_failure(tmp_path):
    """Only what a provider or the network can cause counts as that provider failing: a TypeError
    in our own code (here the caller's progress callback) propagates, and no provider is blamed."""
    source = tmp_path / "blob.bin"
    source.write_bytes(os.urandom(MAX_CHUNK + 1))
    blamed = []

    def buggy_progress(done, total):
        raise TypeError("a bug of ours")

    async def main():
        with trio.fail_after(60):
            async with AsyncExitStack() as stack:
                a, c = [await stack.enter_async_context(open_p2p(ident(50 + i), "127.0.0.1", 0)) for i in range(2)]
                cache_a = BlobCache(tmp_path / "a", 1 << 30)
                a.set_stream_handler(BLOB_PROTOCOL, cache_a.serve)
                digest = cache_a.add_file(source, pin=True)
                await c.connect(a.addrs[0])
                with pytest.raises(TypeError, match="a bug of ours"):
                    await BlobCache(tmp_path / "c", 1 << 30).fetch(c, digest, [a.peer_id, a.peer_id], buggy_progress,
                                                                   on_bad_peer=blamed.append)

    trio.run(main)
    assert blamed == []


def test_cache_evicts_least_recently_used_but_never_pinned(tmp_path):
    cache = BlobCache(tmp_path / "cache", max_bytes=3500)
    digests = []
    for i in range(3):
        f = tmp_path / f"f{i}"
        f.write_bytes(bytes([i]) * 1000)
        digests.append(cache.add_file(f, pin=(i == 0)))
        os.utime(cache.path(digests[-1]), (1000 + i, 1000 + i))
    f = tmp_path / "f3"
    f.write_bytes(b"\x03" * 1000)
    digests.append(cache.add_file(f))
    assert cache.has(digests[0])  # pinned, although the oldest
    assert not cache.has(digests[1])  # least recently used unpinned one went
    assert cache.has(digests[2]) and cache.has(digests[3])
    assert cache.used_bytes() == 3000


def test_chunk_table_is_computed_once_kept_and_evicted_with_its_blob(tmp_path):
    run_dir = tmp_path / "run"
    save_checkpoint(run_dir, init_state(dataclasses.replace(PRESETS["tiny"].config, n_layers=1), seed=2))
    cache = BlobCache(tmp_path / "cache", max_bytes=1 << 30)
    digest = cache.add_file(checkpoint_path(run_dir, 0))
    other = tmp_path / "not-a-checkpoint"
    other.write_bytes(b"\x00" * 100)
    plain = cache.add_file(other)

    async def main():
        table = await cache.chunk_table(digest)
        assert table == compute_table(checkpoint_path(run_dir, 0))
        assert cache.table_path(digest).read_bytes() == table  # kept: the next request reads it
        with pytest.raises(ChunkTableError):
            await cache.chunk_table(plain)

    trio.run(main)
    cache.max_bytes = 0
    cache.evict()
    assert not cache.has(digest) and not cache.table_path(digest).exists()
