"""The fetcher: a run's files for whoever needs them, fetched from peers, verified against the
manifest (:class:`~.runs.RunFiles`), and linked into a working directory.

* :meth:`Fetcher.for_replay` — the samples and checkpoint k (the auditor, a dispute);
* :meth:`Fetcher.for_operator` — the same in the operator's own directory, held until released
  (``/v1/fetch``: ``open1b-node replay RUN``);
* :meth:`Fetcher.for_spot` — the samples, the fingerprints and the chunks of checkpoints k and k+1 a
  spot check reads (the spot checker);
* :meth:`Fetcher.for_eval` — checkpoint k while an evaluation check lasts (the evaluator), None while
  it cannot be fetched.

A checkpoint fetched on the bulk path is checked chunk by chunk against h_k, whose preimage
includes the batch step k-1 consumed: the run's samples. Each method fetches the samples first
and hands their directory to the bulk fetch (:class:`~.runs.BulkFetch` ``samples_dir``), so that
dependency is in the arguments, not in a comment.

It owns what fetching does to the network besides downloading: a blob we now hold is announced
(provided) in the background, without holding up its user (:meth:`serve_fetcher` runs those
tasks), and a provider caught serving wrong bytes is penalised (and counted in :attr:`penalised`).
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator, Awaitable, Callable

import trio

from open1b.deterministic.config import from_manifest_model
from open1b.deterministic.fingerprint import chunk_count
from open1b.deterministic.spot_state import AFTER, BEFORE, part_paths, spot_pieces
from open1b.protocol import Identity, Open1bError, RunManifest, challenge_signature
from open1b.protocol.spotcheck import derive_chunks

from .p2p import P2P
from .runs import (
    FIND_PROVIDERS_TIMEOUT_S,
    BulkFetch,
    RunBlob,
    RunFiles,
    RunFilesError,
    checkpoint_blob,
    fingerprints_blob,
    samples_blob,
)

log = logging.getLogger("open1b.node.fetcher")

SPOT_DIR = "spot"  # the spot checker's working directories beside the replay's (RunFiles.work_dir)
# The operator's replays' working directory (``open1b-node replay RUN``): the node's own replays
# and disputes release checkpoint k from theirs when done, which unlinked it under an operator's
# replay of the same step reading it from there (CI: the replay failed in one line).
OPERATOR_DIR = "operator"
EVAL_DIR = "eval"  # the evaluator's, for the same reason (it checks one state at a time)


class Fetcher:
    def __init__(self, identity: Identity, runfiles: RunFiles, p2p: P2P) -> None:
        self.identity, self.runfiles, self.p2p = identity, runfiles, p2p
        self.penalised: Counter[str] = Counter()  # peer -> wrong bytes it was caught serving
        self._operator: Counter[tuple[bytes, int]] = Counter()  # (run, step) -> operator replays holding it
        self._nursery: trio.Nursery | None = None

    async def serve_fetcher(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run the background provides until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    # -- what each user needs ----------------------------------------------------------------------
    async def for_replay(self, manifest: RunManifest, step: int, purpose: str = "") -> tuple[Path, list[RunBlob]]:
        """Fetch (or find in the cache) what replaying ``step`` needs and assemble the working
        directory (``purpose``'s, :meth:`RunFiles.work_dir`); the blobs linked there (release all
        but the samples after use)."""
        samples_dir, samples = await self._samples(manifest)
        checkpoint = checkpoint_blob(manifest, step)
        await self._fetch(checkpoint, bulk=BulkFetch(self.identity, manifest, step, samples_dir))
        linked = [samples, checkpoint] if purpose else [checkpoint]  # the replays' directory has the samples
        return self.runfiles.assemble(manifest, linked, purpose=purpose), [samples, checkpoint]

    async def for_operator(self, manifest: RunManifest, step: int) -> Path:
        """:meth:`for_replay`'s files in the operator's working directory (OPERATOR_DIR), which
        only :meth:`release_operator` unlinks from, once every operator replay holding ``step``
        released it."""
        work, _ = await self.for_replay(manifest, step, OPERATOR_DIR)
        self._operator[(manifest.run_id, step)] += 1
        return work

    def release_operator(self, manifest: RunManifest, step: int) -> bool:
        """An operator replay of ``step`` is done with its files; False if none held them."""
        key = (manifest.run_id, step)
        if not self._operator[key]:  # a Counter answers 0 without adding the key
            return False
        self._operator[key] -= 1
        if not self._operator[key]:
            del self._operator[key]
            self.runfiles.release(manifest, [checkpoint_blob(manifest, step)], purpose=OPERATOR_DIR)
        return True

    async def for_spot(self, manifest: RunManifest, step: int, lane: int = 0) -> tuple[Path, Callable[[], None]]:
        """What a spot check of ``step`` needs (docs/run-format.md §10.2): the samples, the run's
        fingerprints, and of checkpoints k and k+1 only the chunks the check reads
        (:func:`~open1b.deterministic.spot_state.spot_pieces` of the chunks this node's challenge
        selects: every parameter of k, and the moments and parameters under the challenged gradient
        chunks), each checked against the h_k-proven chunk table as it arrives; a checkpoint no
        bulk provider serves in part is fetched whole. All in the working directory of the spot
        checker's ``lane``; and how to release the checkpoints after."""
        samples_dir, samples = await self._samples(manifest)
        purpose = f"{SPOT_DIR}{lane}"
        work = self.runfiles.work_dir(manifest.run_id, purpose)
        _, config, _ = from_manifest_model(dict(manifest.model))
        # the chunks the spot checker's challenge will select: its signature is deterministic
        chunks = derive_chunks(challenge_signature(self.identity, manifest.run_id, step), chunk_count(config))
        whole: list[RunBlob] = []

        async def checkpoint(k: int, which: str) -> None:
            bulk = BulkFetch(self.identity, manifest, k, samples_dir)
            if await self.runfiles.fetch_part(self.p2p, bulk, spot_pieces(config, chunks, which), work,
                                              self._penalise) is None:
                blob = checkpoint_blob(manifest, k)
                await self._fetch(blob, bulk=bulk)
                whole.append(blob)

        # All at once: a small blob's fetch is mostly round trips (asking peers, a bulk
        # handshake), which overlap; each is verified on its own.
        fetches = [functools.partial(checkpoint, step, BEFORE), functools.partial(checkpoint, step + 1, AFTER),
                   functools.partial(self.runfiles.fetch_fingerprints, self.p2p, manifest,
                                     on_bad_peer=self._penalise, provide=self._provide_soon)]
        await all_or_first_error(fetches)
        fingerprints = fingerprints_blob(manifest)
        assert fingerprints is not None  # fetch_fingerprints raised otherwise
        run_dir = self.runfiles.assemble(manifest, [samples, *whole, fingerprints], purpose=purpose)

        def release() -> None:  # keep samples.bin and fingerprints.cbor (every check reads them)
            self.runfiles.release(manifest, whole, purpose=purpose)
            for path in (*part_paths(work, step), *part_paths(work, step + 1)):
                path.unlink(missing_ok=True)
        return run_dir, release

    @asynccontextmanager
    async def for_eval(self, manifest: RunManifest, state: int) -> AsyncIterator[Path | None]:
        """While an evaluation check lasts, a run directory of the evaluator's own (EVAL_DIR: the
        node's replays release checkpoint k from theirs when done) holding checkpoint ``state``,
        fetched as for a replay of that step; None while that fails (the evaluator tries again
        next round)."""
        try:
            run_dir, blobs = await self.for_replay(manifest, state, EVAL_DIR)
        except (Open1bError, OSError) as exc:
            log.info("evaluation of state %d of %s waits: %s", state, manifest.run_id.hex()[:16], exc)
            yield None
            return
        try:
            yield run_dir
        finally:
            self.release(manifest, blobs, EVAL_DIR)

    def release(self, manifest: RunManifest, blobs: list[RunBlob], purpose: str = "") -> None:
        """After a replay: drop the checkpoint links :meth:`for_replay` made (the samples stay)."""
        self.runfiles.release(manifest, blobs[1:], purpose=purpose)

    # -- fetching ----------------------------------------------------------------------------------
    async def _samples(self, manifest: RunManifest) -> tuple[Path, RunBlob]:
        """The run's samples, fetched and linked into the replay's directory, and that directory."""
        samples = samples_blob(manifest)
        await self._fetch(samples)
        return self.runfiles.assemble(manifest, [samples]), samples

    async def _fetch(self, blob: RunBlob, bulk: BulkFetch | None = None) -> Path:
        return await self.runfiles.fetch(self.p2p, blob, on_bad_peer=self._penalise, provide=self._provide_soon,
                                         bulk=bulk)

    def _penalise(self, peer: str) -> None:
        """``peer`` served bytes that are not the blob it was asked for: provably its fault."""
        self.penalised[peer] += 1
        self.p2p.penalise(peer)

    def _provide_soon(self, key: str) -> None:
        """Announce a blob we now hold without holding up the user that fetched it (a DHT
        provide can take seconds, and up to its timeout when peers are unreachable)."""
        if self._nursery is None:
            raise RuntimeError("fetch before serve_fetcher started")
        p2p = self.p2p

        async def provide() -> None:
            with trio.move_on_after(FIND_PROVIDERS_TIMEOUT_S):
                await p2p.provide(key)

        self._nursery.start_soon(provide)


async def all_or_first_error(fetches: list[Callable[[], Awaitable[object]]]) -> None:
    """Run ``fetches`` at once; if any failed with :class:`RunFilesError`, raise the first (plain,
    as one sequential fetch would), once all have finished."""
    errors: list[RunFilesError] = []

    async def one(fetch: Callable[[], Awaitable[object]]) -> None:
        try:
            await fetch()
        except RunFilesError as exc:
            errors.append(exc)

    async with trio.open_nursery() as nursery:
        for fetch in fetches:
            nursery.start_soon(one, fetch)
    if errors:
        raise errors[0]
