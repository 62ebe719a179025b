"""Certified evaluation and the leaderboard (docs/protocol.md §8.5–§8.6): pure functions of the
statements, so two nodes holding the same statements show the same board."""

import random

import pytest

from open1b.protocol import EvalStatement, TrustPolicy, evaluations, leaderboard, validate_eval
from open1b.protocol.errors import WrongTypeError
from open1b.protocol.evaluation import EvalStatus
from tests.vectors import fixtures
from tests.vectors.common import NOW


def board_inputs():
    runs = [fixtures.eval_manifest(), fixtures.eval_manifest(steps=6), fixtures.eval_manifest(steps=8)]
    evals, atts = [], []
    for i, run in enumerate(runs):
        loss = 0x3f800000 + (i << 20)  # 1.0, 1.125, 1.25
        for k in (2, 4):
            evals.append(fixtures.evaluation(0, run, k, verdict="result", loss=loss, claimed=loss))
            evals += [fixtures.evaluation(w, run, k, loss=loss, claimed=loss) for w in (1, 2)]
        atts += [fixtures.attestation(1, run, s) for s in range(run.steps)]
    atts.append(fixtures.attestation(2, runs[1], 0, match=False))  # run 1 is disputed: listed, not ranked
    return runs, atts, evals


def test_two_nodes_with_the_same_statements_show_the_same_board():
    runs, atts, evals = board_inputs()
    first = leaderboard(runs, atts, evals, now=NOW, min_keys=2)
    for seed in range(5):  # another node heard them in another order, some twice
        rng = random.Random(seed)
        shuffled = [rng.sample(x, len(x)) for x in (runs, atts, evals)]
        again = leaderboard(shuffled[0], shuffled[1] + atts[:3], shuffled[2] + evals[:4], now=NOW, min_keys=2)
        assert again == first
    assert [(r.run, r.rank, r.reason) for r in first] == [
        (runs[0].run_id, 1, ""), (runs[2].run_id, 2, ""), (runs[1].run_id, None, "disputed steps")]
    assert first[0].loss == 1.0 and first[0].eval_state == 4 and first[0].replayed == 1.0


def test_an_uncertified_number_is_never_ranked():
    runs, atts, evals = board_inputs()
    results_only = [e for e in evals if e.verdict == "result"]
    assert all(r.rank is None for r in leaderboard(runs, atts, results_only, now=NOW))
    # the publisher's own checks are invalid (eval_signer), so it cannot certify itself
    own = [fixtures.evaluation(0, runs[0], 2, loss=fixtures.LOSS)]
    assert validate_eval(own[0].encoded, {runs[0].run_id: runs[0]}.get, NOW).code == "eval_signer"


@pytest.mark.parametrize("min_keys,status", [(1, EvalStatus.CERTIFIED), (2, EvalStatus.UNCHECKED)])
def test_min_keys(min_keys, status):
    run = fixtures.eval_manifest()
    evals = [fixtures.evaluation(0, run, 2, verdict="result"), fixtures.evaluation(1, run, 2)]
    assert evaluations(run, evals, min_keys=min_keys)[0].status is status


def test_allowlist_counts_only_its_keys():
    run = fixtures.eval_manifest()
    evals = [fixtures.evaluation(0, run, 2, verdict="result"), fixtures.evaluation(3, run, 2),
             fixtures.evaluation(2, run, 2, verdict="mismatch", loss=1)]
    policy = TrustPolicy("allowlist", frozenset({fixtures.ident(1).public_key}))
    assert evaluations(run, evals, policy=policy)[0].status is EvalStatus.UNCHECKED
    assert evaluations(run, evals)[0].status is EvalStatus.DISPUTED


def test_verdict_must_agree_with_the_losses():
    run = fixtures.eval_manifest()
    with pytest.raises(WrongTypeError):
        fixtures.evaluation(1, run, 2, verdict="mismatch", loss=7, claimed=7)
    with pytest.raises(WrongTypeError):
        fixtures.evaluation(1, run, 2, loss=7, claimed=8)
    good = fixtures.evaluation(1, run, 2)
    assert EvalStatement.decode(good.encoded) == good
