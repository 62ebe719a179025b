"""A run's fingerprints file is one of its blobs (docs/run-format.md §6.1, §10.1): published with
the run only when it has the manifest's fingerprints_root, pinned, and fetched from a real peer
over loopback, bounded, checked against both of the manifest's commitments."""

from __future__ import annotations

import pytest
import trio

from open1b.node.blobs import BLOB_PROTOCOL, BlobCache, file_digest
from open1b.node.p2p import open_p2p
from open1b.node.runs import RunFiles, RunFilesError, blob_count, fingerprints_blob, run_blobs
from open1b.protocol import RunManifest
from open1b.protocol.fingerprints import FINGERPRINTS_FILE, KEY_BLOB, KEY_ROOT

from .conftest import ident


def _resigned(manifest: RunManifest, data: dict) -> RunManifest:
    """The manifest with the ``data`` map ``data``, signed again by its publisher (ident(0))."""
    body = {k: v for k, v in manifest.body().items() if k not in ("kind", "v", "publisher")}
    return RunManifest.create(ident(0), **{**body, "data": data})


def test_the_fingerprints_file_is_a_blob_of_the_run(tampered_run):
    run_dir, manifest = tampered_run
    blob = fingerprints_blob(manifest)
    assert blob is not None and blob.digest.hex() == manifest.data[KEY_BLOB] and blob.relpath == FINGERPRINTS_FILE
    assert (run_dir / FINGERPRINTS_FILE).stat().st_size <= blob.max_size
    assert run_blobs(manifest)[-1] == blob and blob_count(manifest) == len(run_blobs(manifest)) == manifest.steps + 3
    plain = _resigned(manifest, {k: v for k, v in manifest.data.items() if k not in (KEY_ROOT, KEY_BLOB)})
    assert fingerprints_blob(plain) is None and blob_count(plain) == manifest.steps + 2


def test_publishing_checks_the_root_and_pins_the_file(tmp_path, tampered_run):
    run_dir, manifest = tampered_run
    files = RunFiles(tmp_path / "data", BlobCache(tmp_path / "data" / "blobs", 1 << 30))
    # the file has the address the manifest names, but not the root it signs: refused whole
    wrong_root = _resigned(manifest, {**manifest.data, KEY_ROOT: "00" * 32})
    with pytest.raises(RunFilesError, match="fingerprints.*fingerprints_root"):
        trio.run(files.import_dir, wrong_root, run_dir)
    assert not any(files.cache.dir.iterdir())
    trio.run(files.import_dir, manifest, run_dir)
    assert files.cache.has(fingerprints_blob(manifest).digest)
    assert fingerprints_blob(manifest).digest in files.cache.pinned


def test_fetched_from_a_peer_and_checked_against_the_root(tmp_path, tampered_run):
    run_dir, manifest = tampered_run
    blamed: list[str] = []

    async def main():
        with trio.fail_after(60):
            async with open_p2p(ident(70), "127.0.0.1", 0) as fetcher, open_p2p(ident(71), "127.0.0.1", 0) as server:
                served = BlobCache(tmp_path / "server", 1 << 30)
                served.add_file(run_dir / FINGERPRINTS_FILE)
                server.set_stream_handler(BLOB_PROTOCOL, served.serve)
                await fetcher.connect(server.addrs[0])
                files = RunFiles(tmp_path / "fetcher", BlobCache(tmp_path / "fetcher" / "blobs", 1 << 30))
                path = await files.fetch_fingerprints(fetcher, manifest, blamed.append, provide=lambda key: None)
                assert file_digest(path) == fingerprints_blob(manifest).digest
                assert path.read_bytes() == (run_dir / FINGERPRINTS_FILE).read_bytes()
                # a publisher that signed a root the file does not have: the file arrives (its
                # address is right), is refused, and the provider is not blamed
                with pytest.raises(RunFilesError, match="fingerprints_root"):
                    await files.fetch_fingerprints(fetcher, _resigned(manifest, {**manifest.data, KEY_ROOT: "ab" * 32}),
                                                   blamed.append, provide=lambda key: None)  # fmt: skip

    trio.run(main)
    assert blamed == []
