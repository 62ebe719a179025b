"""The evaluation component (node/evaluator.py) on an in-memory gossip bus: a publisher's results
are checked by two auditors and end certified; a tampered result ends disputed; an observer's
leaderboard is the one its stored statements imply."""

import shutil
from contextlib import asynccontextmanager

import cbor2
import pytest
import trio
import trio.testing

from open1b.deterministic.device import cpu_device_class
from open1b.deterministic.runfile import EVALUATIONS_FILE
from open1b.node.evaluator import Evaluator
from open1b.node.store import Store
from open1b.protocol import TrustPolicy, leaderboard

from .conftest import ident

NOW = 1_800_000_000


@pytest.fixture(scope="module")
def eval_run(tmp_path_factory):
    from open1b.deterministic.trainer import publish_run

    run_dir = tmp_path_factory.mktemp("eval-run")
    return run_dir, publish_run(run_dir, ident(0), steps=4, seed=2, eval_documents=8, eval_every=2)


class BusOutbox:
    """A node's outbox on the bus: stored, then (if new) delivered to every other node, which
    validates and stores it as node/statements.py does with gossip; ``gossiped`` records what left."""

    def __init__(self, name, nodes):
        self.name, self.nodes, self.gossiped = name, nodes, []

    async def publish(self, statement) -> bool:
        if not self.nodes[self.name].store.add_eval(statement):
            return False
        await self.regossip(statement)
        return True

    async def regossip(self, statement) -> None:
        self.gossiped.append(statement.encoded)
        for other, node in self.nodes.items():
            if other != self.name and (verdict := node.validate(statement.encoded)).accepted:
                node.store.add_eval(verdict.message)


def network(tmp_path, manifest, run_dir, names=("publisher", "a1", "a2", "observer")):
    """Four evaluators whose published statements reach every other one (a gossip topic)."""
    nodes = {}

    @asynccontextmanager
    async def checkpoint(m, k):
        yield run_dir

    for i, name in enumerate(names):
        store = Store(tmp_path / f"{name}.sqlite")
        store.add_manifest(manifest)
        nodes[name] = Evaluator(store, ident(i), outbox=BusOutbox(name, nodes), checkpoint=checkpoint,
                                now=lambda: NOW, device=cpu_device_class(), policy=TrustPolicy, redundancy=2)
    return nodes


async def audit(nodes, manifest, run_dir):
    assert await nodes["publisher"].publish_results(manifest, run_dir) == 2
    assert await nodes["a1"].check_pending() == 2 and await nodes["a2"].check_pending() == 2
    assert await nodes["observer"].check_pending() == 2  # the observer checks too, here; a third key
    assert await nodes["a1"].check_pending() == 0  # nothing twice


def test_results_end_certified_and_the_observer_board_is_its_statements(eval_run, tmp_path):
    run_dir, manifest = eval_run
    nodes = network(tmp_path, manifest, run_dir)
    trio.run(audit, nodes, manifest, run_dir)
    observer = nodes["observer"]
    assert [e["status"] for e in observer.status(manifest)] == ["certified", "certified"]
    rows = observer.leaderboard_json()  # what /v1/leaderboard answers
    implied = leaderboard([manifest], [], observer.store.evals(manifest.run_id), now=NOW, min_keys=2)
    assert rows == [r.to_json() for r in implied] and rows[0]["rank"] == 1
    for name in ("a1", "a2"):  # every node holds the same statements, so shows the same board
        assert nodes[name].leaderboard_json() == rows


def test_a_tampered_result_ends_disputed(eval_run, tmp_path):
    run_dir, manifest = eval_run
    forged_dir = tmp_path / "forged"
    shutil.copytree(run_dir, forged_dir)
    results = cbor2.loads((forged_dir / EVALUATIONS_FILE).read_bytes())
    results[1][1] ^= 1  # the trainer claims another loss for state 4
    (forged_dir / EVALUATIONS_FILE).write_bytes(cbor2.dumps(results))
    nodes = network(tmp_path, manifest, run_dir)

    async def go():
        assert await nodes["publisher"].publish_results(manifest, forged_dir) == 2
        for name in ("a1", "a2", "observer"):
            await nodes[name].check_pending()

    trio.run(go)
    status = nodes["observer"].status(manifest)
    assert [e["status"] for e in status] == ["certified", "disputed"] and len(status[1]["dissenters"]) == 3
    (row,) = nodes["observer"].leaderboard_json()
    assert row["rank"] is None and row["reason"] == "disputed evaluation"


def test_a_result_that_cannot_be_checked_is_logged_once_and_not_signed(eval_run, tmp_path, caplog):
    run_dir, manifest = eval_run
    nodes = network(tmp_path, manifest, run_dir, names=("publisher", "a1"))
    empty = tmp_path / "empty"
    empty.mkdir()

    @asynccontextmanager
    async def no_checkpoint_file(m, k):
        yield empty  # a directory without the checkpoint: the check fails, nothing is signed

    nodes["a1"].checkpoint = no_checkpoint_file

    async def go():
        await nodes["publisher"].publish_results(manifest, run_dir)
        assert await nodes["a1"].check_pending() == 0
        assert await nodes["a1"].check_pending() == 0  # not retried

    trio.run(go)
    assert [e.verdict for e in nodes["a1"].store.evals(manifest.run_id)] == ["result", "result"]
    assert sum("cannot check the evaluation" in r.message for r in caplog.records) == 2


def test_serve_checks_once_and_republishes_every_round(eval_run, tmp_path):
    run_dir, manifest = eval_run
    nodes = network(tmp_path, manifest, run_dir, names=("publisher", "a1"))
    outbox, enough = nodes["a1"].outbox, trio.Event()
    sent, times = outbox.gossiped, []
    delivered = outbox.regossip

    async def record(statement):
        await delivered(statement)
        times.append(trio.current_time())
        if len(sent) == 2 + 2 * 4:  # its two checks, then two republish rounds of all four statements
            enough.set()

    outbox.regossip = record

    async def go():
        await nodes["publisher"].publish_results(manifest, run_dir)
        async with trio.open_nursery() as nursery:
            await nursery.start(nodes["a1"].serve_evaluator)
            await enough.wait()  # no deadline: the check runs in a thread, which virtual time skips past
            nursery.cancel_scope.cancel()

    trio.run(go, clock=trio.testing.MockClock(autojump_threshold=0))
    assert nodes["a1"].checked == 2  # checked once, not again each round
    # certified at redundancy 2 needs two checking keys: unsettled, so each round republishes all four
    assert len(set(sent[2:6])) == 4 and sent[2:6] == sent[6:10]
    assert times[6] - times[2] == 10  # one round later
