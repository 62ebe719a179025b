"""The dishonest trainer of the scenarios: exactly the forged steps fail to replay."""

import pytest

from open1b.deterministic.replay import replay
from open1b.devnet.forged_run import publish_forged_run

from ..node.conftest import ident


def test_each_forgery_breaks_exactly_its_own_step(tmp_path):
    forgeries = {1: "bitflip", 3: "batch", 4: "skip"}
    manifest = publish_forged_run(tmp_path, ident(0), steps=6, seed=2, forgeries=forgeries)
    results = [replay(tmp_path, k) for k in range(manifest.steps)]
    assert [r.step for r in results if not r.match] == sorted(forgeries)
    # every checkpoint, forged ones included, hashes to its published h_k: the replayer found no
    # broken input, only a published h_{k+1} that the step does not produce
    assert all(r.pre_state == manifest.state_hashes[r.step] for r in results)


def test_unknown_forgery_or_step_is_refused(tmp_path):
    with pytest.raises(ValueError):
        publish_forged_run(tmp_path, ident(0), steps=2, forgeries={0: "rewrite"})
    with pytest.raises(ValueError):
        publish_forged_run(tmp_path, ident(0), steps=2, forgeries={2: "bitflip"})


@pytest.mark.parametrize("step", [1, 4])
def test_a_forged_op_reaches_the_published_state(tmp_path, step):
    """Step 4 is the forged-op devnet's at 8 steps (the middle one), step 1 bench/dispute_bench.py's:
    with the op's lowest bit flipped, the optimizer's rounding absorbed the change at both (no
    parameter differed), so the forged run replayed as honest and there was nothing to dispute."""
    publish_forged_run(tmp_path, ident(0), steps=step + 1, seed=0, forgeries={step: "forged-op"})
    assert not replay(tmp_path, step).match
