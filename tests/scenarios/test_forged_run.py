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
