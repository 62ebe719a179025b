"""``publishers``: an operator chooses whose runs the node learns from the network and audits."""

import time

import pytest

from open1b.node.config import ConfigError, NodeConfig, load_config, write_config
from open1b.node.ledger import Ledger
from open1b.protocol import Outcome
from tests.runs import run_manifest

from .conftest import ident
from .fakes import make_ledger


def _manifest(publisher: int, steps: int = 2):
    return run_manifest(ident(publisher), engine="e", engine_version="1", model={}, data={}, seed=publisher,
                        steps=steps, state_hashes=[bytes([k]) * 32 for k in range(steps + 1)],
                        created_at=int(time.time()) - 60)


def _daemon(tmp_path, **config) -> Ledger:
    return make_ledger(tmp_path / "node", **config)


def test_without_a_list_any_publishers_run_is_taken(tmp_path):
    node = _daemon(tmp_path)
    assert node.statements.judge_manifest(_manifest(5).encoded).outcome is Outcome.ACCEPT


def test_with_a_list_other_publishers_runs_are_ignored_not_rejected(tmp_path):
    node = _daemon(tmp_path, publishers=(ident(1).peer_id, ident(2).peer_id))
    for chosen in (1, 2):
        assert node.statements.judge_manifest(_manifest(chosen).encoded).outcome is Outcome.ACCEPT
    other = node.statements.judge_manifest(_manifest(3).encoded)
    # [IGNORE]: a well-formed run is not the sender's fault; the peer that relayed it is not penalised
    assert (other.outcome, other.code) == (Outcome.IGNORE, "publisher")
    # a run the node already holds (the operator published it, or named it with --run) stays accepted
    known = _manifest(3)
    node.manifests[known.run_id] = known
    assert node.statements.judge_manifest(known.encoded).outcome is Outcome.ACCEPT


def test_publishers_in_config_toml_are_checked_peer_ids(tmp_path):
    config = NodeConfig(data_dir=tmp_path, publishers=(ident(1).peer_id,))
    write_config(config)
    assert load_config(tmp_path).publishers == (ident(1).peer_id,)
    (tmp_path / "config.toml").write_text('[node]\npublishers = ["not-a-peer-id"]\n')
    with pytest.raises(ConfigError, match="publisher 'not-a-peer-id'"):
        load_config(tmp_path)
