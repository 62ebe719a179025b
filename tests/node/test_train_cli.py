"""``open1b-node train``: a run trained by W processes is replayed, step by step, by one."""

import json

import pytest

from .commands import cli

pytestmark = pytest.mark.integration


def test_train_with_two_ranks_then_replay_each_step_in_one_process(tmp_path):
    run_dir, data_dir = tmp_path / "run", tmp_path / "node"
    rc, out, err = cli("train", "--steps", "2", "--ranks", "2", "--seed", "3", "--out", str(run_dir),
                       "--data-dir", str(data_dir), "--json", timeout=600)
    assert rc == 0, err
    summary = json.loads(out)
    assert summary["ranks"] == 2 and summary["steps"] == 2
    for step in range(2):
        rc, out, err = cli("replay", str(run_dir), "--step", str(step), "--data-dir", str(data_dir), "--json", timeout=600)
        assert rc == 0 and json.loads(out)["verdict"] == "match", err


@pytest.mark.parametrize("ranks", ["0", "-2", "two"])
def test_train_refuses_a_rank_count_below_one(tmp_path, ranks):
    rc, _, err = cli("train", "--steps", "1", "--ranks", ranks, "--out", str(tmp_path / "run"),
                     "--data-dir", str(tmp_path / "node"), timeout=60)
    assert rc == 2 and "--ranks" in err
    assert not (tmp_path / "run").exists()
