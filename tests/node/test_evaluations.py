"""Certified evaluation at the node (node/evaluations.py): the publisher's results, auditors'
checks of them, a tampered result that ends disputed, and the leaderboard two stores holding the
same statements agree on."""

import random

import pytest

from open1b.deterministic.device import cpu_device_class
from open1b.node.evaluations import EvaluationError, board, check_result, render_board, sign_results
from open1b.node.store import Store
from open1b.protocol import TrustPolicy, evaluations, validate_eval
from open1b.protocol.evaluation import EvalStatus

from .conftest import ident

NOW = 1_800_000_000
DEVICE = cpu_device_class()


@pytest.fixture(scope="module")
def eval_run(tmp_path_factory):
    from open1b.deterministic.trainer import publish_run

    run_dir = tmp_path_factory.mktemp("eval-run")
    return run_dir, publish_run(run_dir, ident(0), steps=4, seed=2, eval_documents=8, eval_every=2)


@pytest.fixture(scope="module")
def statements(eval_run):
    run_dir, manifest = eval_run
    results = sign_results(run_dir, manifest, ident(0), device=DEVICE, now=NOW)
    tampered = type(results[0]).create(ident(0), **{**{f: getattr(results[1], f) for f in results[1].SCHEMA
                                                      if f != "signer"}, "loss": results[1].loss ^ 1,
                                                   "claimed": results[1].loss ^ 1})
    checks = [check_result(run_dir, manifest, r, ident(w), device=DEVICE, now=NOW)
              for r in (*results, tampered) for w in (1, 2)]
    return results, tampered, checks


def test_results_and_checks_are_valid_statements(eval_run, statements):
    _, manifest = eval_run
    results, tampered, checks = statements
    assert [r.state for r in results] == [2, 4]
    for s in (*results, tampered, *checks):
        assert validate_eval(s.encoded, {manifest.run_id: manifest}.get, NOW).accepted
    assert [c.verdict for c in checks] == ["match"] * 4 + ["mismatch"] * 2
    with pytest.raises(EvaluationError):
        sign_results(eval_run[0], manifest, ident(1), device=DEVICE, now=NOW)  # not the publisher


def test_honest_results_are_certified_and_a_tampered_one_disputed(eval_run, statements):
    _, manifest = eval_run
    results, tampered, checks = statements
    honest = evaluations(manifest, [*results, *checks], min_keys=2)
    assert [e.status for e in honest] == [EvalStatus.CERTIFIED, EvalStatus.CERTIFIED]
    forged = evaluations(manifest, [results[0], tampered, *checks], min_keys=2)
    assert [e.status for e in forged] == [EvalStatus.CERTIFIED, EvalStatus.DISPUTED]
    assert len(forged[1].dissenters) == 2


def test_two_stores_with_the_same_statements_show_the_same_board(eval_run, statements, tmp_path):
    _, manifest = eval_run
    results, _, checks = statements
    everything = [*results, *checks]
    boards = []
    for seed in (1, 2):
        store = Store(tmp_path / f"{seed}.sqlite")
        store.add_manifest(manifest)
        for s in random.Random(seed).sample(everything, len(everything)) + everything[:2]:
            store.add_eval(s)
        boards.append(board(store, policy=TrustPolicy(), redundancy=2, now=NOW))
        store.close()
    assert boards[0] == boards[1]
    (row,) = boards[0]
    assert (row.rank, row.eval_state, row.certified, row.reason) == (1, 4, 2, "")
    assert row.loss_bits == results[1].loss and row.replayed == 0.0
    assert "1     " in render_board([row.to_json()])
