"""Publishing a run and fetching its files from peers (docs/run-format.md §6), with real daemons
on loopback and no shared run directory: only the publisher ever sees the trainer's output."""

from __future__ import annotations

import json
import random
import shutil
import time

import pytest
import trio

from open1b.deterministic.runfile import MANIFEST_FILE, checkpoint_path
from open1b.devnet import Daemons
from open1b.node.blobs import BLOB_PROTOCOL, BlobCache, file_digest, provider_key
from open1b.node.client import call
from open1b.node.clock import Clock
from open1b.node.config import NodeConfig
from open1b.node.daemon import open_daemon
from open1b.node.p2p import open_p2p
from open1b.node.runs import RunFilesError, checkpoint_blob
from open1b.protocol.codec import encode

from .commands import cli, wait_for
from .conftest import ident

pytestmark = pytest.mark.integration

def verdicts(api, run):
    """Coverage as attestations decide it (claims are short-lived hints and are not synced)."""
    return [(s["step"], s["status"], s["auditors"], s["dissenters"]) for s in call(api, f"/v1/coverage/{run}")["per_step"]]


def test_publish_refuses_bad_files_then_auditors_fetch_replay_and_a_late_joiner_syncs(tmp_path, tampered_run):
    run_dir, manifest = tampered_run
    run_hex = manifest.run_id.hex()
    published = tmp_path / "published"  # the trainer's output, seen by the publisher only
    shutil.copytree(run_dir, published)
    daemons = Daemons(tmp_path / "net", published, redundancy=1)
    (tmp_path / "net").mkdir()
    addrs = daemons.plan(4)
    try:
        daemons.start(0, audit=False, bootstrap=[])  # the publisher
        # an auditor with no run directory; no spot checks, whose steps (and so the checkpoints they
        # fetch beyond a replay's) are its random choice: the counts below are exact
        daemons.start(1, audit=True, bootstrap=[addrs[0]], extra_args=("--no-spot-checks",))
        publisher, auditor = daemons.api(0), daemons.api(1)
        token_of = ("--data-dir", str(daemons.dirs[0]))  # publishing needs the publisher's API token

        # refused before anything is accepted: a checkpoint whose bytes are not the manifest's
        forged = tmp_path / "forged"
        shutil.copytree(run_dir, forged)
        data = bytearray(checkpoint_path(forged, 3).read_bytes())
        data[-1] ^= 1
        checkpoint_path(forged, 3).write_bytes(bytes(data))
        rc, _, err = cli("publish", str(forged), "--api", publisher, *token_of)
        assert rc == 1 and "checkpoint 3" in err and "the manifest's address" in err, err
        # ... a missing one
        checkpoint_path(forged, 3).write_bytes(checkpoint_path(run_dir, 3).read_bytes())
        checkpoint_path(forged, 4).unlink()
        rc, _, err = cli("publish", str(forged), "--api", publisher, *token_of)
        assert rc == 1 and "checkpoint 4: missing file" in err, err
        # ... a manifest that does not verify
        raw = bytearray((forged / MANIFEST_FILE).read_bytes())
        raw[-5] ^= 1
        (forged / MANIFEST_FILE).write_bytes(bytes(raw))
        rc, _, err = cli("publish", str(forged), "--api", publisher, *token_of)
        assert rc == 1 and "HTTP 400" in err, err
        # ... and no daemon to talk to
        rc, _, err = cli("publish", str(published), "--data-dir", str(tmp_path / "nobody"))
        assert rc == 1 and "no running daemon" in err, err
        status = call(publisher, "/v1/status")
        assert status["runs"] == [] and status["blobs"]["pinned"] == 0 and status["blobs"]["cache_bytes"] == 0

        rc, out, err = cli("publish", str(published), "--api", publisher, *token_of, "--json")
        assert rc == 0, err
        job = json.loads(out)
        assert job["run"] == run_hex and job["state"] == "done" and job["gossiped"]
        assert job["provided"] == manifest.steps + 3  # samples file, every checkpoint, the fingerprints file

        # an operator with the files at hand: `daemon --run DIR` imports them the same way
        daemons.start(2, audit=False, bootstrap=[addrs[0]], extra_args=("--run", str(published)))
        wait_for(lambda: [j["state"] for j in call(daemons.api(2), "/v1/publications")] == ["done"],
                 120, what="the --run import")
        assert call(daemons.api(2), "/v1/status")["blobs"]["pinned"] == manifest.steps + 3

        # the auditor learns the run by gossip, fetches each step's files from peers, replays
        wait_for(lambda: call(auditor, f"/v1/coverage/{run_hex}")["complete"], 120,
                 what="the auditor to cover the run")
        cov = call(auditor, f"/v1/coverage/{run_hex}")
        assert cov["disputed_steps"] == [2] and cov["verified_steps"] == manifest.steps - 1
        a, p = call(auditor, "/v1/status"), call(publisher, "/v1/status")
        assert a["replays"] == manifest.steps and a["blobs"]["fetched"] == manifest.steps + 1  # samples + S checkpoints
        assert a["blobs"]["bulk_fetched"] == manifest.steps  # every checkpoint over the bulk path, chunk-checked
        served = p["blobs"]["served_bytes"] + call(daemons.api(2), "/v1/status")["blobs"]["served_bytes"]
        assert a["blobs"]["fetched_bytes"] > 0 and served >= a["blobs"]["fetched_bytes"]
        assert a["blobs"]["bad_providers"] == 0 and a["blobs"]["fetch_failures"] == 0
        work = daemons.dirs[1] / "runs" / run_hex
        assert (work / MANIFEST_FILE).read_bytes() == manifest.encoded
        assert file_digest(work / "samples.bin") == manifest.samples_blob
        assert [r["run_dir"] for r in call(auditor, "/v1/runs")] == [None]  # nothing local: all fetched

        # a node that joins afterwards learns the manifest, past gossipsub's message cache (5
        # heartbeats of 1 s), through the runs sync protocol. A loaded machine stretches the
        # heartbeats and gossip can still hand it over (CI saw that twice), so which path delivered
        # it is pinned by tests/node/test_sync.py's joiner that hears no gossip, not here
        time.sleep(12)
        daemons.start(3, audit=False, bootstrap=[addrs[1]])
        late = daemons.api(3)
        wait_for(lambda: call(late, "/v1/status")["runs"] == [run_hex], 120,
                 what="the late joiner to learn the run")
        wait_for(lambda: verdicts(late, run_hex) == verdicts(auditor, run_hex), 60, what="the late joiner's coverage")
    finally:
        daemons.stop()


def test_a_provider_serving_wrong_bytes_is_penalised_and_its_bytes_never_used(tmp_path, tampered_run):
    run_dir, manifest = tampered_run
    samples = run_dir / "samples.bin"

    async def garbage(stream):
        while True:
            await stream.receive(128)
            await stream.send(encode({"size": 1000}))
            await stream.send(bytes(1000))

    async def main():
        config = NodeConfig(data_dir=tmp_path / "node", listen="127.0.0.1:0", api="127.0.0.1:0", audit=False)
        with trio.fail_after(60):
            async with open_daemon(config, clock=Clock(), rng=random.Random(0)) as daemon:
                async with open_p2p(ident(60), "127.0.0.1", 0) as liar, open_p2p(ident(61), "127.0.0.1", 0) as honest:
                    cache = BlobCache(tmp_path / "honest", 1 << 30)
                    cache.add_file(samples)  # the honest peer holds the samples, not yet the checkpoint
                    honest.set_stream_handler(BLOB_PROTOCOL, cache.serve)
                    liar.set_stream_handler(BLOB_PROTOCOL, garbage)
                    for host in (liar, honest):
                        await host.connect(daemon.p2p.addrs[0])
                    await daemon.ledger.statements.add_run(manifest, None)
                    blob = checkpoint_blob(manifest, 1)
                    assert await honest.provide(provider_key(manifest.samples_blob))
                    assert await liar.provide(provider_key(blob.digest))  # the only provider of checkpoint 1

                    with pytest.raises(RunFilesError, match="checkpoint 1"):
                        await daemon.fetcher.for_replay(manifest, 1)
                    assert daemon.p2p.rejected.get(liar.peer_id, 0) >= 1  # penalised like any reject
                    assert daemon.p2p.rejected.get(honest.peer_id, 0) == 0
                    assert not daemon.runfiles.cache.has(blob.digest)  # nothing of its bytes kept
                    assert daemon.runfiles.stats.bad_providers >= 1

                    cache.add_file(checkpoint_path(run_dir, 1))
                    assert await honest.provide(provider_key(blob.digest))
                    work, _ = await daemon.fetcher.for_replay(manifest, 1)
                    assert file_digest(checkpoint_path(work, 1)) == manifest.checkpoints[1]
                    assert file_digest(work / "samples.bin") == manifest.samples_blob
                    assert daemon.p2p.rejected.get(honest.peer_id, 0) == 0

    trio.run(main)
