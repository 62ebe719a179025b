"""The fetcher (node/fetcher.py): a spot check's files are fetched at once (the fetches overlap,
and a failure reaches the spot checker as the plain RunFilesError it handles, only after every
other fetch has finished); a provider caught serving wrong bytes is penalised and counted; a
fetched blob is announced in the background; a bulk checkpoint fetch is handed the samples it is
checked with."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from open1b.deterministic import PRESETS
from open1b.deterministic.config import to_manifest_model
from open1b.deterministic.runfile import ENGINE, ENGINE_VERSION
from open1b.node.blobs import BlobCache, file_digest
from open1b.node.fetcher import Fetcher, all_or_first_error
from open1b.node.runs import RunFiles, RunFilesError, checkpoint_blob, samples_blob, why_not_auditable
from open1b.protocol import Identity, blake2b256

from ..runs import run_manifest
from .conftest import ident
from .fakes import FakeP2P, auditable_manifest


def test_fetches_overlap_and_the_first_failure_is_raised_plain_after_all_finish():
    order: list[str] = []

    async def main():
        first, second = trio.Event(), trio.Event()

        async def a():  # waits for b: fetched one after the other, this never ends
            second.set()
            await first.wait()
            order.append("a")

        async def b():
            await second.wait()
            first.set()
            order.append("b")
            raise RunFilesError("checkpoint 4: no provider")

        async def c():
            await trio.sleep(0.2)
            order.append("c")
            raise RunFilesError("fingerprints: no provider")

        with trio.fail_after(10):
            await all_or_first_error([a, b, c])

    with pytest.raises(RunFilesError, match="checkpoint 4"):  # not an ExceptionGroup
        trio.run(main)
    assert sorted(order) == ["a", "b", "c"]


class LyingProviderFiles:
    """Run files whose every fetch first meets a provider serving wrong bytes (blamed through
    ``on_bad_peer``, as RunFiles does), then succeeds; records what each fetch was given."""

    def __init__(self) -> None:
        self.fetches, self.assembled = [], []

    async def fetch(self, p2p, blob, on_bad_peer, provide=None, bulk=None):
        await trio.sleep(0)
        on_bad_peer("liar")
        self.fetches.append((blob.name, bulk))
        provide(f"/open1b/blob/{blob.digest.hex()}")
        return Path("/cache") / blob.digest.hex()

    def assemble(self, manifest, blobs, purpose=""):
        self.assembled.append([b.name for b in blobs])
        return Path("/work") / manifest.run_id.hex()

    def release(self, manifest, blobs, purpose=""):
        pass


def test_a_replays_files_penalise_the_liar_announce_what_was_fetched_and_hand_the_samples_to_the_bulk_fetch():
    manifest = auditable_manifest(ident(0), steps=3, created_at=1_800_000_000)
    files, p2p = LyingProviderFiles(), FakeP2P()
    fetcher = Fetcher(ident(1), files, p2p)

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(fetcher.serve_fetcher)
            run_dir, blobs = await fetcher.for_replay(manifest, 2)
            await trio.testing.wait_all_tasks_blocked()  # the provides run beside, not before the return
            nursery.cancel_scope.cancel()
        return run_dir, blobs

    run_dir, blobs = trio.run(main)
    [(samples, no_bulk), (checkpoint, bulk)] = files.fetches
    assert samples == samples_blob(manifest).name and no_bulk is None
    # the checkpoint's bulk fetch is given the directory the samples were linked into, explicitly
    assert files.assembled[0] == [samples] and bulk.samples_dir == run_dir and bulk.step == 2
    assert [b.name for b in blobs] == [samples, checkpoint]
    assert p2p.penalised == ["liar", "liar"] and fetcher.penalised == {"liar": 2}
    assert sorted(p2p.provided) == sorted(f"/open1b/blob/{b.digest.hex()}" for b in blobs)


def test_a_fetch_before_the_fetcher_serves_says_so():
    manifest = auditable_manifest(ident(0), steps=3, created_at=1_800_000_000)
    fetcher = Fetcher(ident(1), LyingProviderFiles(), FakeP2P())
    with pytest.raises(RuntimeError, match="before serve_fetcher"):
        trio.run(fetcher.for_replay, manifest, 0)


def test_a_node_audits_the_runs_of_every_engine_version_its_engine_replays():
    # 0.4.0 runs (witness rule v1) still replay on engine 0.5 (docs/run-format.md §5.1); others do not.
    tiny = PRESETS["tiny"]
    model = to_manifest_model("tiny", tiny.config, tiny.topology)

    def manifest(version: str):
        return run_manifest(Identity(blake2b256(b"publisher")), engine=ENGINE, engine_version=version, model=model,
                            data={}, seed=0, steps=1, state_hashes=[bytes(32), bytes(32)], created_at=1)

    assert why_not_auditable(manifest("0.4.0")) is None and why_not_auditable(manifest(ENGINE_VERSION)) is None
    assert "0.3.0" in why_not_auditable(manifest("0.3.0"))


def test_an_operators_replay_keeps_its_files_while_the_nodes_own_replay_of_the_step_releases_them(tmp_path,
                                                                                                  tampered_run):
    """``open1b-node replay RUN`` replays from files the node fetched for it (``/v1/fetch``). They
    were linked into the directory of the node's own replays, whose release, once the node's
    replay or dispute of the same step ended, unlinked the checkpoint under the operator's replay
    (CI: the command failed in one line). Now they are the operator's, held until every operator
    replay of the step is done."""
    run_dir, manifest = tampered_run
    files = RunFiles(tmp_path, BlobCache(tmp_path / "blobs", 1 << 30))
    fetcher = Fetcher(ident(1), files, FakeP2P())
    checkpoint = checkpoint_blob(manifest, 2)

    async def main():
        await files.import_dir(manifest, run_dir)  # held already: nothing crosses the network
        async with trio.open_nursery() as nursery:
            await nursery.start(fetcher.serve_fetcher)
            operator = await fetcher.for_operator(manifest, 2)
            assert await fetcher.for_operator(manifest, 2) == operator  # a second operator replay of the step
            own, blobs = await fetcher.for_replay(manifest, 2)  # the node's own, done first
            fetcher.release(manifest, blobs)
            assert own != operator and not (own / checkpoint.relpath).exists()
            path = operator / checkpoint.relpath
            assert file_digest(path) == checkpoint.digest and (operator / samples_blob(manifest).relpath).exists()
            assert fetcher.release_operator(manifest, 2) and path.exists()  # one of the two is done
            assert fetcher.release_operator(manifest, 2) and not path.exists()
            assert not fetcher.release_operator(manifest, 2)  # nothing held: said so, nothing else
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_an_evaluation_check_reads_checkpoint_k_from_a_directory_of_its_own_until_it_ends(tmp_path, tampered_run):
    """The evaluator read checkpoint k from the node's replays' directory, never released it,
    and a replay of step k released it there under the check — a check that failed for good
    (the evaluator does not retry a result it could not check)."""
    run_dir, manifest = tampered_run
    files = RunFiles(tmp_path, BlobCache(tmp_path / "blobs", 1 << 30))
    fetcher = Fetcher(ident(1), files, FakeP2P())
    checkpoint = checkpoint_blob(manifest, 1)

    async def main():
        await files.import_dir(manifest, run_dir)
        async with trio.open_nursery() as nursery:
            await nursery.start(fetcher.serve_fetcher)
            async with fetcher.for_eval(manifest, 1) as evaluated:
                own, blobs = await fetcher.for_replay(manifest, 1)
                fetcher.release(manifest, blobs)
                assert file_digest(evaluated / checkpoint.relpath) == checkpoint.digest
            assert not (evaluated / checkpoint.relpath).exists() and own != evaluated
            nursery.cancel_scope.cancel()

    trio.run(main)
