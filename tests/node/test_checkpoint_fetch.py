"""Checkpoints fetched over the bulk path (node/checkpoint_fetch.py), every chunk checked against
h_k on arrival: real checkpoint files of real states, real TCP on loopback."""

import dataclasses
import json
import shutil
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import trio

from open1b.deterministic.config import PRESETS
from open1b.deterministic.provenance import load_run_samples
from open1b.deterministic.runfile import checkpoint_path, max_checkpoint_bytes, save_checkpoint
from open1b.deterministic.spot_state import BEFORE, open_part, part_paths, spot_pieces
from open1b.deterministic.state import init_state
from open1b.node import checkpoint_fetch
from open1b.node.blobs import BlobCache, BlobMismatch, file_digest
from open1b.node.bulk import BACK_MAGIC, DIALBACK_PROTOCOL, BulkPeer, BulkServer, DialBackPeer, serve_bulk
from open1b.node.checkpoint_fetch import (
    CHECKERS,
    RECORD_MAGIC,
    CheckpointFetchError,
    fetch_checkpoint,
    fetch_checkpoint_part,
    wanted_pieces,
)  # fmt: skip
from open1b.node.chunk_table import (
    ChunkTableError,
    Expectation,
    check_layout,
    checkpoint_expectation,
    compute_table,
    expected_shapes,
    read_layout,
    state_expectation,
)
from open1b.node.files import StorageFull
from open1b.node.p2p import open_p2p
from open1b.protocol.hashing import blake2b256

from .conftest import fill, ident

FETCHER = ident(70)
PROVIDERS = [ident(71 + i) for i in range(3)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A real checkpoint whose larger tensors span several 1 MiB chunks (the last one short):
    one layer of width 384 (mlp_fc is 2.25 MiB), ~23 MB in all."""
    config = dataclasses.replace(PRESETS["small"].config, n_layers=1)
    state = init_state(config, seed=5)
    run_dir = tmp_path_factory.mktemp("state")
    address = save_checkpoint(run_dir, state)
    expect = state_expectation(state, address, prev=blake2b256(b"test-genesis"))
    return checkpoint_path(run_dir, 0), expect


class _LyingCache(BlobCache):
    """A provider that serves whatever its cache file holds (an honest one hashes a blob that
    changed on disk before serving it, and drops it)."""

    async def open_verified(self, digest: bytes):
        return self.open_blob(digest)


def provider_cache(root, source, address, *, corrupt_at: tuple[int, ...] = (), lying: bool = False) -> BlobCache:
    """A provider's cache holding ``source`` under ``address``; with ``corrupt_at`` it serves a
    copy with one byte flipped at each of those offsets (and still the true chunk table). A
    ``lying`` one (or one with ``corrupt_at``) serves its file without checking it first."""
    cache = (_LyingCache if corrupt_at or lying else BlobCache)(root, 1 << 34)
    shutil.copyfile(source, cache.path(address))
    with open(cache.path(address), "r+b") as f:
        for offset in corrupt_at:
            f.seek(offset)
            byte = f.read(1)
            f.seek(offset)
            f.write(bytes([byte[0] ^ 1]))
    cache.store_table(address, compute_table(source))
    return cache


async def serving(nursery, caches, rate=None) -> list[BulkPeer]:
    peers = []
    for identity, cache in zip(PROVIDERS, caches):
        port = await nursery.start(lambda task_status, c=cache, i=identity: serve_bulk(
            c, i, "127.0.0.1", 0, rate_bytes_per_s=rate, task_status=task_status))
        peers.append(BulkPeer(identity.peer_id, "127.0.0.1", port))
    return peers


def test_chunk_table_proves_the_state_hash(checkpoint):
    path, expect = checkpoint
    layout = read_layout(path)
    assert [t.name for t in layout.tensors] == sorted(expect.shapes, key=str.encode)
    assert max(t.chunks for t in layout.tensors) == 3
    table = compute_table(path, workers=2)
    expect.check_table(layout, table)  # the same h as protocol.commitments.state_hash of the state
    assert compute_table(path, workers=1) == table
    flipped = bytearray(table)
    flipped[40] ^= 1
    with pytest.raises(ChunkTableError, match="does not hash to h_0"):
        expect.check_table(layout, bytes(flipped))
    with pytest.raises(ChunkTableError, match="metadata"):
        check_layout(layout, expect.shapes, step=1)
    other = dict(expect.shapes, **{"param/wte": (1, 1)})
    with pytest.raises(ChunkTableError, match="shape differs"):
        check_layout(layout, other, step=0)


def test_layout_refuses_malformed_headers(tmp_path, checkpoint):
    path, _ = checkpoint
    data = path.read_bytes()
    n = struct.unpack_from("<Q", data)[0]
    entries = json.loads(data[8:8 + n])
    first = min((k for k in entries if k != "__metadata__"), key=lambda k: entries[k]["data_offsets"][0])

    def rewritten(mutate) -> bytes:
        e = json.loads(data[8:8 + n])
        mutate(e)
        header = json.dumps(e).encode()
        header += b" " * (-len(header) % 8)
        return struct.pack("<Q", len(header)) + header + data[8 + n:]

    cases = {
        "gap": lambda e: e[first]["data_offsets"].__setitem__(0, 4),
        "overlap": lambda e: e[first]["data_offsets"].__setitem__(1, e[first]["data_offsets"][1] + 4),
        "dtype": lambda e: e[first].__setitem__("dtype", "F64"),
    }
    for name, mutate in cases.items():
        bad = tmp_path / name
        bad.write_bytes(rewritten(mutate))
        with pytest.raises(ChunkTableError):
            read_layout(bad)
    huge = tmp_path / "huge"
    huge.write_bytes(struct.pack("<Q", 1 << 40) + data[8:])
    with pytest.raises(ChunkTableError, match="header of"):
        read_layout(huge)


def test_a_wrong_chunk_is_caught_at_that_chunk_and_the_fetch_resumes(tmp_path, checkpoint, monkeypatch):
    """The done-when line of issue 13: the liar is cut off at its first wrong chunk and blamed;
    the chunks verified before it stay on disk, and the next fetch continues from them."""
    path, expect = checkpoint
    pieces = read_layout(path).pieces()
    bad = 5  # the sixth chunk in file order is wrong
    liar = provider_cache(tmp_path / "liar", path, expect.address, corrupt_at=(pieces[bad].offset + 7,))
    fetcher = BlobCache(tmp_path / "fetcher", 1 << 34)
    blamed, verified = [], []
    # "Cut off at that chunk" is measured from the event itself, the moment the wrong chunk's check
    # fails: the CHECKERS threads check chunks side by side, so while that check waits for a core
    # (a loaded machine) the others go on accepting later chunks and the liar goes on serving
    # them; a fixed count of chunks past the wrong one held only when the machine was quiet.
    real_check = checkpoint_fetch._Assembly.check_and_write
    accepted: list[int] = []
    at_failure: dict[str, int] = {}
    lock = threading.Lock()

    def watched_check(assembly, index, data):
        ok = real_check(assembly, index, data)
        with lock:
            if ok:
                accepted.append(index)
            elif index == bad and not at_failure:
                at_failure.update(accepted=len(accepted), served=liar.served_bytes)
        return ok

    monkeypatch.setattr(checkpoint_fetch._Assembly, "check_and_write", watched_check)

    async def main():
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                [peer] = await serving(nursery, [liar])
                with pytest.raises(CheckpointFetchError, match="does not match the chunk table"):
                    await fetch_checkpoint(fetcher, FETCHER, [peer], expect, on_bad_peer=blamed.append,
                                           progress=lambda done, total: verified.append(done), window=1)
                nursery.cancel_scope.cancel()

    trio.run(main)
    header = pieces[0].offset
    assert blamed == [PROVIDERS[0].peer_id]
    record = fetcher.path(expect.address).with_suffix(".pieces").read_bytes()
    kept = {i for (i,) in struct.iter_unpack("<I", record[len(RECORD_MAGIC) + 32:])}
    # cut off at that chunk: it was never accepted, everything before it was; once its check had
    # failed, only the other checker finished: the check in its thread (CHECKERS - 1 at most), and
    # one more it may start before the failed check's task runs again to cancel (a thread is not
    # cancelled; seen once in CI: 2 after the failure); the liar served only what had been asked
    # of it already (the window: one request, and one more the receiving task may send before the
    # cancel reaches it)
    assert at_failure, "the wrong chunk was never checked"
    assert set(range(bad)) <= kept and bad not in kept and kept == set(accepted)
    assert liar.served_bytes >= header + sum(p.length for p in pieces[:bad + 1])  # it did serve the wrong one
    assert len(accepted) - at_failure["accepted"] <= 2 * (CHECKERS - 1)
    assert liar.served_bytes - at_failure["served"] <= 2 * max(p.length for p in pieces)
    assert verified[-1] == header + sum(pieces[i].length for i in kept)
    partial = fetcher.path(expect.address).with_suffix(".partial").read_bytes()
    source = path.read_bytes()
    assert all(partial[pieces[i].offset:pieces[i].offset + pieces[i].length]
               == source[pieces[i].offset:pieces[i].offset + pieces[i].length] for i in kept)
    assert not fetcher.has(expect.address)
    monkeypatch.undo()

    honest = provider_cache(tmp_path / "honest", path, expect.address)

    async def resume():
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                peers = await serving(nursery, [honest])
                report = await fetch_checkpoint(fetcher, FETCHER, peers, expect)
                nursery.cancel_scope.cancel()
        return report

    report = trio.run(resume)
    assert report.resumed_pieces == len(kept) and not report.blamed
    assert honest.served_bytes == path.stat().st_size - sum(pieces[i].length for i in kept)
    assert file_digest(fetcher.path(expect.address)) == expect.address
    assert not fetcher.path(expect.address).with_suffix(".partial").exists()
    assert not fetcher.path(expect.address).with_suffix(".pieces").exists()
    assert fetcher.table_path(expect.address).read_bytes() == compute_table(path)  # kept for serving


def test_parallel_providers_give_the_same_file_and_a_liar_among_them_is_dropped(tmp_path, checkpoint):
    path, expect = checkpoint
    pieces = read_layout(path).pieces()
    caches = [provider_cache(tmp_path / "p0", path, expect.address),
              provider_cache(tmp_path / "p1", path, expect.address, corrupt_at=tuple(p.offset for p in pieces)),
              provider_cache(tmp_path / "p2", path, expect.address)]
    blamed = []

    async def main():
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                peers = await serving(nursery, caches, rate=40e6)  # 40 MB/s each: all three get work
                report = await fetch_checkpoint(BlobCache(tmp_path / "fetcher", 1 << 34), FETCHER, peers, expect,
                                                on_bad_peer=blamed.append)
                nursery.cancel_scope.cancel()
        return report

    report = trio.run(main)
    assert report.path.read_bytes() == path.read_bytes()
    assert set(report.bytes_by_peer) == {PROVIDERS[0].peer_id, PROVIDERS[2].peer_id}  # both honest ones worked
    assert sum(report.bytes_by_peer.values()) == path.stat().st_size - pieces[0].offset
    # every chunk of the liar is wrong: cut off at its first, which the others fetched instead
    assert blamed == report.blamed == [PROVIDERS[1].peer_id]


def test_a_cancelled_fetch_resumes_with_its_verified_chunks(tmp_path, checkpoint):
    path, expect = checkpoint
    cache = provider_cache(tmp_path / "p", path, expect.address)
    fetcher = BlobCache(tmp_path / "fetcher", 1 << 34)

    async def fetch(stop_after: int | None):
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                peers = await serving(nursery, [cache], rate=50e6)
                with trio.CancelScope() as scope:
                    count = []

                    def progress(done, total):
                        count.append(done)
                        if stop_after is not None and len(count) == stop_after:
                            scope.cancel()  # as a crash or shutdown would, mid-transfer

                    report = await fetch_checkpoint(fetcher, FETCHER, peers, expect, progress=progress)
                nursery.cancel_scope.cancel()
        return None if scope.cancelled_caught else report

    assert trio.run(fetch, 4) is None
    report = trio.run(fetch, None)
    assert report.resumed_pieces >= 4
    assert file_digest(report.path) == expect.address

    # once more, and then the kept bytes go bad on disk (a power loss after the record was
    # written): the address check fails, nobody can be blamed, and the file is fetched afresh
    report.path.unlink()
    assert trio.run(fetch, 4) is None
    partial = fetcher.path(expect.address).with_suffix(".partial")
    record = fetcher.path(expect.address).with_suffix(".pieces").read_bytes()
    recorded = struct.unpack_from("<I", record, len(RECORD_MAGIC) + 32)[0]
    with open(partial, "r+b") as f:
        f.seek(read_layout(path).pieces()[recorded].offset)
        kept = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([kept[0] ^ 0xFF]))
    blamed = []

    async def refetch():
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                peers = await serving(nursery, [cache])
                result = await fetch_checkpoint(fetcher, FETCHER, peers, expect, on_bad_peer=blamed.append)
                nursery.cancel_scope.cancel()
        return result

    again = trio.run(refetch)
    assert blamed == [] and again.resumed_pieces == 0
    assert file_digest(again.path) == expect.address


def test_a_provider_with_a_different_header_is_blamed_at_the_address_check(tmp_path, checkpoint):
    """A header in another JSON spelling passes the layout check and every chunk verifies, but the
    file is not the one the manifest names: the only unverified bytes are the header's."""
    path, expect = checkpoint
    data = path.read_bytes()
    n = struct.unpack_from("<Q", data)[0]
    header = json.dumps(json.loads(data[8:8 + n]), indent=1).encode()
    header += b" " * (-len(header) % 8)
    respelled = tmp_path / "respelled"
    respelled.write_bytes(struct.pack("<Q", len(header)) + header + data[8 + n:])
    liar = provider_cache(tmp_path / "liar", respelled, expect.address, lying=True)
    fetcher = BlobCache(tmp_path / "fetcher", 1 << 34)
    blamed = []

    async def main():
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                peers = await serving(nursery, [liar])
                with pytest.raises(BlobMismatch, match="does not hash to its address"):
                    await fetch_checkpoint(fetcher, FETCHER, peers, expect, on_bad_peer=blamed.append)
                nursery.cancel_scope.cancel()

    trio.run(main)
    assert blamed == [PROVIDERS[0].peer_id]
    assert not list(fetcher.dir.iterdir())  # nothing of it kept


def test_checkpoint_of_a_published_run_is_checked_against_its_manifest(tmp_path, tampered_run):
    """Checkpoint k > 0 of a real run: h_k commits to step k-1's batch, which the fetcher
    recomputes from the run's samples. A provider serving another checkpoint of the run under this
    address is left out, not blamed (its table does not prove h_k, which is also what an honest
    provider of a file the publisher misdescribed would send), and the fetch completes from the
    honest one."""
    run_dir, manifest = tampered_run
    dataset = load_run_samples(run_dir, manifest)
    expect = checkpoint_expectation(manifest, 2, dataset)
    assert expect.shapes == expected_shapes(PRESETS["tiny"].config)
    right = provider_cache(tmp_path / "right", checkpoint_path(run_dir, 2), manifest.checkpoints[2])
    wrong = provider_cache(tmp_path / "wrong", checkpoint_path(run_dir, 1), manifest.checkpoints[2], lying=True)
    blamed = []

    async def main():
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                peers = await serving(nursery, [wrong, right])
                report = await fetch_checkpoint(BlobCache(tmp_path / "fetcher", 1 << 30), FETCHER, peers, expect,
                                                on_bad_peer=blamed.append)
                nursery.cancel_scope.cancel()
        return report

    report = trio.run(main)
    assert blamed == [] and set(report.bytes_by_peer) == {PROVIDERS[1].peer_id}  # the wrong one's header names step 1
    assert report.path.read_bytes() == checkpoint_path(run_dir, 2).read_bytes()
    with pytest.raises(ValueError):
        checkpoint_expectation(manifest, 2, None)


def test_providers_without_the_blob_or_unreachable_are_skipped_not_blamed(tmp_path, checkpoint):
    path, expect = checkpoint
    empty = BlobCache(tmp_path / "empty", 1 << 20)
    honest = provider_cache(tmp_path / "honest", path, expect.address)
    blamed = []

    async def main():
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                without, with_it = await serving(nursery, [empty, honest])
                closed = trio.socket.socket()
                await closed.bind(("127.0.0.1", 0))
                unreachable = BulkPeer(PROVIDERS[2].peer_id, "127.0.0.1", closed.getsockname()[1])
                closed.close()  # nothing listens there
                report = await fetch_checkpoint(BlobCache(tmp_path / "fetcher", 1 << 34), FETCHER,
                                                [unreachable, without, with_it], expect, on_bad_peer=blamed.append)
                nursery.cancel_scope.cancel()
        return report

    report = trio.run(main)
    assert blamed == [] and set(report.bytes_by_peer) == {PROVIDERS[1].peer_id}
    assert file_digest(report.path) == expect.address


def crash_victim(cache_dir: str, fetch_dir: str, address: str, state_hash: str, prev: str) -> None:
    """Run by :func:`test_a_killed_fetch_resumes`'s child process: serve the checkpoint slowly and
    fetch it, until the parent kills the process."""
    config = dataclasses.replace(PRESETS["small"].config, n_layers=1)
    expect = Expectation(bytes.fromhex(address), max_checkpoint_bytes(config), expected_shapes(config), 0,
                         bytes.fromhex(state_hash), bytes.fromhex(prev), 0, bytes(32))

    async def main():
        async with trio.open_nursery() as nursery:
            peers = await serving(nursery, [BlobCache(Path(cache_dir), 1 << 34)], rate=5e6)
            await fetch_checkpoint(BlobCache(Path(fetch_dir), 1 << 34), FETCHER, peers, expect)

    trio.run(main)


def test_a_killed_fetch_resumes(tmp_path, checkpoint):
    """SIGKILL mid-transfer (no cleanup runs): the next fetch keeps what the record says was verified."""
    path, expect = checkpoint
    provider_cache(tmp_path / "p", path, expect.address)
    fetcher = BlobCache(tmp_path / "fetcher", 1 << 34)
    record = fetcher.path(expect.address).with_suffix(".pieces")
    child = subprocess.Popen([sys.executable, "-c", "import sys; from tests.node.test_checkpoint_fetch import "
                              "crash_victim; crash_victim(*sys.argv[1:])", str(tmp_path / "p"), str(fetcher.dir),
                              expect.address.hex(), expect.state_hash.hex(), expect.prev.hex()],
                             cwd=Path(__file__).parents[2])
    try:
        deadline = time.monotonic() + 60
        while not (record.exists() and record.stat().st_size >= len(RECORD_MAGIC) + 32 + 4 * 5):
            assert child.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        child.kill()
        child.wait()
    kept = (record.stat().st_size - len(RECORD_MAGIC) - 32) // 4

    async def resume():
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                peers = await serving(nursery, [provider_cache(tmp_path / "q", path, expect.address)])
                report = await fetch_checkpoint(fetcher, FETCHER, peers, expect)
                nursery.cancel_scope.cancel()
        return report

    report = trio.run(resume)
    assert report.resumed_pieces >= kept >= 5
    assert file_digest(report.path) == expect.address


def test_a_full_disk_ends_a_bulk_fetch_as_storage_full_blaming_no_one(tmp_path, checkpoint, small_tmpfs, monkeypatch):
    """Issue 15's disk safety on the bulk path, as on libp2p: the free-space check refuses before
    a byte is written; a disk filled by someone else after the check fails the fetch when its
    blocks are allocated (before any chunk), as "storage full", with no partial file left and no
    provider blamed; with room again, the same fetch succeeds."""
    path, expect = checkpoint
    provider = provider_cache(tmp_path / "p", path, expect.address)
    fetcher = BlobCache(small_tmpfs / "blobs", 1 << 34, reserve_bytes=10 << 20)  # 23 MB + 10 MB > 30 MiB
    blamed = []

    async def fetch():
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                peers = await serving(nursery, [provider])
                try:  # the outcome, not wrapped in the serving nursery's exception group
                    return await fetch_checkpoint(fetcher, FETCHER, peers, expect, on_bad_peer=blamed.append)
                except StorageFull as exc:
                    return exc
                finally:
                    nursery.cancel_scope.cancel()

    outcome = trio.run(fetch)
    assert isinstance(outcome, StorageFull) and "reserve" in str(outcome)
    assert list(fetcher.dir.iterdir()) == []
    fetcher.reserve_bytes = 0
    filler = small_tmpfs / "filler"
    checked = fetcher.room

    def room_then_filled(nbytes):  # the check passes, then another process takes the space
        checked(nbytes)
        filler.write_bytes(b"\0" * (16 << 20))

    monkeypatch.setattr(fetcher, "room", room_then_filled)
    outcome = trio.run(fetch)
    assert isinstance(outcome, StorageFull) and "no space left" in str(outcome)
    assert list(fetcher.dir.iterdir()) == [] and blamed == []
    monkeypatch.setattr(fetcher, "room", checked)
    filler.unlink()
    report = trio.run(fetch)
    assert file_digest(report.path) == expect.address and blamed == []


def test_a_provider_on_a_full_disk_still_serves_its_checkpoints(tmp_path, checkpoint, small_tmpfs):
    """Issue 15: a node whose disk is full keeps serving reads. Its chunk table of a checkpoint is
    computed when first asked for, then kept beside the blob; with no room to keep it, it is
    served all the same (it was the end of the session: no peer could fetch that checkpoint from
    this provider over the bulk path)."""
    path, expect = checkpoint
    provider = BlobCache(small_tmpfs / "p", 1 << 34)
    shutil.copyfile(path, provider.path(expect.address))  # held, its table not computed yet
    fill(small_tmpfs)
    fetcher = BlobCache(tmp_path / "f", 1 << 34)

    async def fetch():
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                peers = await serving(nursery, [provider])
                report = await fetch_checkpoint(fetcher, FETCHER, peers, expect)
                nursery.cancel_scope.cancel()
        return report

    assert file_digest(trio.run(fetch).path) == expect.address
    assert sorted(p.name for p in provider.dir.iterdir()) == [expect.address.hex()]  # no half-written table


def test_a_spot_checks_fetch_takes_only_its_chunks_proven_by_the_table(tmp_path, checkpoint):
    """Issue 29 item 5: the chunks a spot check reads, each checked against the h_k-proven table,
    into a sparse file the spot check's reader accepts; a liar among the providers is blamed at
    its first chunk and the others finish; an interrupted fetch resumes with what it verified."""
    path, expect = checkpoint
    layout = read_layout(path)
    config = dataclasses.replace(PRESETS["small"].config, n_layers=1)
    chunks = spot_pieces(config, (3, 40), BEFORE)
    wanted = wanted_pieces(layout, chunks)
    pieces = layout.pieces()
    caches = [provider_cache(tmp_path / "p0", path, expect.address, corrupt_at=tuple(p.offset for p in pieces)),
              provider_cache(tmp_path / "p1", path, expect.address)]
    part, table = part_paths(tmp_path / "verifier", 0)
    blamed = []

    async def main(stop_after: int | None):
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                peers = await serving(nursery, caches)
                with trio.CancelScope() as scope:
                    count = []

                    def progress(done, total):
                        count.append(done)
                        if stop_after is not None and len(count) == stop_after:
                            scope.cancel()

                    report = await fetch_checkpoint_part(FETCHER, peers, expect, chunks, part, table,
                                                         on_bad_peer=blamed.append, progress=progress, window=1)
                nursery.cancel_scope.cancel()
        return None if scope.cancelled_caught else report

    assert trio.run(main, 3) is None and not table.exists()
    report = trio.run(main, None)
    assert report.resumed_pieces >= 3 and blamed and set(blamed) == {PROVIDERS[0].peer_id}
    assert table.read_bytes() == compute_table(path)
    source, held = path.read_bytes(), part.read_bytes()
    assert len(held) == len(source)
    for i, p in enumerate(pieces):
        want = source[p.offset:p.offset + p.length] if i in wanted else bytes(p.length)
        assert held[p.offset:p.offset + p.length] == want, i
    assert part.stat().st_blocks * 512 < len(source)  # sparse: the holes take no disk
    # the spot check's reader accepts it: the table proves h_0, and every parameter is held
    state = open_part(tmp_path / "verifier", 0, config, expect.state_hash, (expect.prev, 0, expect.batch_digest),
                      params=True)
    assert set(state.params) == set(config.param_shapes())

    # what a fetch from scratch costs: the header, the table and the wanted chunks, nothing else
    async def fresh():
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                peers = await serving(nursery, caches[1:])
                report = await fetch_checkpoint_part(FETCHER, peers, expect, chunks, *part_paths(tmp_path / "v2", 0))
                nursery.cancel_scope.cancel()
        return report

    report = trio.run(fresh)
    wanted_bytes = sum(pieces[i].length for i in wanted)
    assert report.size == pieces[0].offset + layout.table_size + wanted_bytes
    assert report.size < len(source)  # every parameter, two of the moments' chunks: less than the file


@pytest.mark.parametrize("honest", [True, False], ids=["honest", "lying"])
def test_a_provider_nobody_can_dial_serves_the_checkpoint_by_dialling_the_fetcher_back(tmp_path, checkpoint, honest):
    """A provider behind NAT holds only an outbound libp2p connection to the fetcher: asked over
    it, it dials the fetcher's bulk listener, and the session that follows is checked as any other
    (a lying provider's wrong chunk is blamed on it). A connection to the listener that brings no
    token the fetcher issued is closed unread."""
    path, expect = checkpoint
    provider = provider_cache(tmp_path / "provider", path, expect.address, corrupt_at=() if honest else (5 << 20,))

    async def main():
        with trio.fail_after(60):
            async with (open_p2p(PROVIDERS[0], "127.0.0.1", 0) as at_home, open_p2p(FETCHER, "127.0.0.1", 0) as fetcher,
                        trio.open_nursery() as nursery):
                serving = BulkServer(provider, PROVIDERS[0])
                await nursery.start(serving.serve, "127.0.0.1", 0)
                at_home.set_stream_handler(DIALBACK_PROTOCOL, serving.dial_back)
                mine = BulkServer(BlobCache(tmp_path / "fetcher", 1 << 34), FETCHER)
                port = await nursery.start(mine.serve, "127.0.0.1", 0)
                await at_home.connect(fetcher.addrs[0])  # the provider dialled out; nobody dials it

                stranger = await trio.open_tcp_stream("127.0.0.1", port)
                await stranger.send_all(BACK_MAGIC + bytes(32))
                assert await stranger.receive_some(1) == b""  # no such token: closed
                await stranger.aclose()

                peer = DialBackPeer(at_home.peer_id, fetcher, mine)
                blamed = []
                try:
                    report = await fetch_checkpoint(mine.cache, FETCHER, [peer], expect, on_bad_peer=blamed.append)
                except CheckpointFetchError:
                    report = None
                nursery.cancel_scope.cancel()
        assert serving.dialled_back == 1 and serving.dialbacks_refused == 0
        if honest:
            assert report.dialled_back == [at_home.peer_id] and not blamed
            assert set(report.bytes_by_peer) == {at_home.peer_id}
            assert file_digest(report.path) == expect.address
        else:
            assert report is None and blamed == [at_home.peer_id]

    trio.run(main)
