"""The spot-check planner: a secret per-key order, spread before repeated, never what is settled."""

from open1b.node.spot_plan import next_spot_checks, spot_order
from open1b.protocol import spot_coverage
from tests.vectors import fixtures

from .conftest import ident


def test_each_key_has_its_own_order_of_every_step():
    run = fixtures.spot_manifest(steps=16)
    a, b = spot_order(ident(1), run.run_id, 16), spot_order(ident(2), run.run_id, 16)
    assert sorted(a) == sorted(b) == list(range(16)) and a != b
    assert spot_order(ident(1), run.run_id, 16) == a  # a key's challenges are always the same


def test_unchecked_steps_first_and_never_the_settled_ones():
    run = fixtures.spot_manifest(steps=4)
    checks = [fixtures.spotcheck(1, run, 0), fixtures.spotcheck(2, run, 1, caught="update")]
    spot = spot_coverage(run, checks)
    order = [0, 1, 2, 3]
    # step 1 failed (a replay's job now), step 3 replayed: 2 is unchecked, then 0 (checked once)
    assert next_spot_checks(order, spot, own=(), replayed=[3], count=4) == [2, 0]
    assert next_spot_checks(order, spot, own=[2], replayed=[3], count=4) == [0]
    assert next_spot_checks([3, 2, 1, 0], spot, own=(), replayed=(), count=2) == [3, 2]
    # the extra lanes: only what no one has checked (step 0 was, by key 1)
    assert next_spot_checks(order, spot, own=(), replayed=[3], count=4, unchecked_only=True) == [2]
    assert next_spot_checks(order, spot, own=[2], replayed=[3], count=4, unchecked_only=True) == []
