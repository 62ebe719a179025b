"""`open1b-node train --ranks 2` on two "machines" — two network namespaces joined by one link —
started by torch's standard launcher (``torchrun``, static rendezvous at MASTER_ADDR:MASTER_PORT,
``env://``): both ranks write the states of the one-process trainer, bit for bit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from open1b.deterministic.runfile import read_manifest
from open1b.deterministic.trainer import publish_run
from open1b.devnet.netns import Partition
from open1b.protocol import Identity

STEPS, PORT = 2, 29517


def _launch(half, node_rank: int, master: str, link: str, data_dir: Path, out: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env["GLOO_SOCKET_IFNAME"] = link  # the machine's link to the other (gloo would guess from the host name)
    cmd = [*half.prefix, sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
           "--node-rank", str(node_rank), "--master-addr", master, "--master-port", str(PORT),
           "-m", "open1b.node.cli", "train", "--data-dir", str(data_dir), "--preset", "tiny", "--ranks", "2",
           "--steps", str(STEPS), "--out", str(out), "--json"]  # fmt: skip
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_two_machines_train_the_bits_of_one_process(tmp_path):
    partition = Partition()  # needs root and iproute2, as the devnet's partition scenario does
    with partition as (a, b):
        procs = [_launch(half, r, a.address, link, tmp_path / f"node{r}", tmp_path / f"run{r}")
                 for r, (half, link) in enumerate(zip((a, b), partition.link))]  # fmt: skip
        for r, proc in enumerate(procs):
            out, _ = proc.communicate(timeout=900)
            assert proc.returncode == 0, out[-3000:]
            assert f'"launched_rank": {r}' in out  # each machine computed its own rank, not all of them
    one = publish_run(tmp_path / "one-process", Identity(os.urandom(32)), steps=STEPS, preset="tiny")
    for r in range(2):
        manifest = read_manifest(tmp_path / f"run{r}")
        assert manifest.model == one.model and manifest.model["ranks"] == 2
        assert manifest.state_hashes == one.state_hashes  # every state, chained: the same bits
        assert manifest.checkpoints == one.checkpoints  # and the same checkpoint files


def test_a_half_set_launch_environment_is_refused(monkeypatch):
    from open1b.deterministic.distributed import launched_rank
    from open1b.deterministic.errors import ConfigError

    assert launched_rank() is None
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="MASTER_ADDR"):
        launched_rank()
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    assert launched_rank() == (1, 2)
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(ConfigError, match="not in"):
        launched_rank()
