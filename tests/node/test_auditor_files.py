"""A spot check's files are fetched at once (node/auditor.py): the fetches overlap, and a failure
reaches the spot checker as the plain RunFilesError it handles (try the step later), only after
every other fetch has finished."""

from __future__ import annotations

import pytest
import trio

from open1b.deterministic import PRESETS
from open1b.deterministic.config import to_manifest_model
from open1b.deterministic.runfile import ENGINE, ENGINE_VERSION
from open1b.node.auditor import _all_or_first_error
from open1b.node.runs import RunFilesError, why_not_auditable
from open1b.protocol import Identity, blake2b256

from ..runs import run_manifest


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
            await _all_or_first_error([a, b, c])

    with pytest.raises(RunFilesError, match="checkpoint 4"):  # not an ExceptionGroup
        trio.run(main)
    assert sorted(order) == ["a", "b", "c"]


def test_a_node_audits_the_runs_of_every_engine_version_its_engine_replays():
    # 0.4.0 runs (witness rule v1) still replay on engine 0.5 (docs/run-format.md §5.1); others do not.
    tiny = PRESETS["tiny"]
    model = to_manifest_model("tiny", tiny.config, tiny.topology)

    def manifest(version: str):
        return run_manifest(Identity(blake2b256(b"publisher")), engine=ENGINE, engine_version=version, model=model,
                            data={}, seed=0, steps=1, state_hashes=[bytes(32), bytes(32)], created_at=1)

    assert why_not_auditable(manifest("0.4.0")) is None and why_not_auditable(manifest(ENGINE_VERSION)) is None
    assert "0.3.0" in why_not_auditable(manifest("0.3.0"))
