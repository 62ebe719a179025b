"""Deliberately broken behaviour is a devnet-only switch: a normal operator cannot turn it on.
``open1b-node`` has no such flag; the harness's own entry point (``open1b.devnet.daemon_entry``)
refuses unless a devnet started it."""

import os
import subprocess
import sys

import pytest
import trio

from open1b.devnet import adversaries as adversary
from open1b.node.config import ConfigError, load_config
from open1b.node.worker import WorkerResult

DAEMON_ARGS = ["--listen", "127.0.0.1:0", "--api", "127.0.0.1:0"]


def test_behaviour_is_refused_outside_a_devnet(monkeypatch):
    monkeypatch.delenv(adversary.ENV_SWITCH, raising=False)
    with pytest.raises(ConfigError, match="devnet-only"):
        adversary.from_name("lie")


def test_behaviour_needs_a_known_name(monkeypatch):
    monkeypatch.setenv(adversary.ENV_SWITCH, "1")
    with pytest.raises(ConfigError, match="unknown behaviour"):
        adversary.from_name("steal")
    assert isinstance(adversary.from_name("lie"), adversary.Lie)


def test_behaviour_is_not_a_config_file_key(tmp_path):
    (tmp_path / "config.toml").write_text('[node]\nbehaviour = "lie"\n')
    with pytest.raises(ConfigError, match="unknown key"):
        load_config(tmp_path)


@pytest.mark.integration  # runs the daemon's command line (refused before it listens)
def test_the_harness_entry_point_refuses_to_start_outside_a_devnet(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != adversary.ENV_SWITCH}
    proc = subprocess.run([sys.executable, "-m", "open1b.devnet.daemon_entry", "--behaviour", "lie",
                           "--data-dir", str(tmp_path / "d"), *DAEMON_ARGS],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 1 and "devnet-only" in proc.stderr


@pytest.mark.integration  # runs the daemon's command line (refused before it listens)
def test_the_node_has_no_behaviour_flag(tmp_path):
    env = {**os.environ, adversary.ENV_SWITCH: "1"}  # not even inside a devnet
    proc = subprocess.run([sys.executable, "-m", "open1b.node.cli", "daemon", "--data-dir", str(tmp_path / "d"),
                           *DAEMON_ARGS, "--behaviour", "lie"], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2 and "unrecognized arguments: --behaviour lie" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "open1b.node.cli", "daemon", "--help"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and "--behaviour" not in proc.stdout and "--trust-policy" in proc.stdout


def test_a_declared_device_is_a_device_class_and_signs_the_honest_bits_under_it(monkeypatch):
    monkeypatch.setenv(adversary.ENV_SWITCH, "1")
    with pytest.raises(ConfigError, match="not a device class"):
        adversary.from_name("device=tpu/v5")
    declared = adversary.from_name("device=cuda/sm_90")
    honest = WorkerResult(b"\x01" * 32, b"\x02" * 32, b"\x03" * 32, 7, "cpu/x86_64-avx2")

    class Honest:
        async def replay(self, manifest, run_dir, step):
            return honest

        def device_class(self):
            return honest.device

    replayer = declared.replayer(Honest())
    assert replayer.device_class() == "cuda/sm_90"  # what it plans with before its first replay
    assert trio.run(replayer.replay, None, None, 0) == WorkerResult(b"\x01" * 32, b"\x02" * 32, b"\x03" * 32, 7,
                                                                      "cuda/sm_90")
