"""Deliberately broken behaviour is a devnet-only switch: a normal operator cannot turn it on."""

import subprocess
import sys

import pytest

from open1b.node.config import ConfigError, NodeConfig, load_config
from open1b.node.devnet import adversaries as adversary


def test_behaviour_is_refused_outside_a_devnet(tmp_path, monkeypatch):
    monkeypatch.delenv(adversary.ENV_SWITCH, raising=False)
    with pytest.raises(ConfigError, match="devnet-only"):
        adversary.from_config(NodeConfig(data_dir=tmp_path, behaviour="lie"))


def test_behaviour_needs_a_known_name(tmp_path, monkeypatch):
    monkeypatch.setenv(adversary.ENV_SWITCH, "1")
    with pytest.raises(ConfigError, match="unknown behaviour"):
        adversary.from_config(NodeConfig(data_dir=tmp_path, behaviour="steal"))
    assert isinstance(adversary.from_config(NodeConfig(data_dir=tmp_path, behaviour="lie")), adversary.Lie)
    assert adversary.from_config(NodeConfig(data_dir=tmp_path)) is None


def test_behaviour_is_not_a_config_file_key(tmp_path):
    (tmp_path / "config.toml").write_text('[node]\nbehaviour = "lie"\n')
    with pytest.raises(ConfigError, match="unknown key"):
        load_config(tmp_path)


def test_daemon_refuses_to_start_with_a_behaviour_outside_a_devnet(tmp_path):
    env = {k: v for k, v in __import__("os").environ.items() if k != adversary.ENV_SWITCH}
    proc = subprocess.run([sys.executable, "-m", "open1b.node.cli", "daemon", "--data-dir", str(tmp_path / "d"),
                           "--listen", "127.0.0.1:0", "--api", "127.0.0.1:0", "--behaviour", "lie"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 1 and "devnet-only" in proc.stderr


def test_the_flag_is_hidden_from_help():
    proc = subprocess.run([sys.executable, "-m", "open1b.node.cli", "daemon", "--help"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and "--behaviour" not in proc.stdout and "--trust-policy" in proc.stdout
