"""The replay's device path (deterministic/replay.py: checkpoint k scanned in pieces, the step on a
CUDA backend, its moments read back from the file to be uploaded) under the numba CUDA simulator:
the pre-state, post-state and witness of the CPU's streamed replay, bit for bit. The simulator is
a process-wide switch, hence the child process; the model is tiny because it is slow."""

import json
import os
import subprocess
import sys

from open1b.deterministic.config import PRESETS, GPTConfig, Preset, Topology
from open1b.deterministic.replay import replay
from open1b.deterministic.trainer import publish_run
from open1b.protocol import Identity, blake2b256

# the byte vocabulary of the shipped corpus, everything else as small as the simulator needs
MICRO_BYTES = Preset(GPTConfig(vocab_size=256, seq_len=4, d_model=8, n_layers=1, n_heads=2, d_ff=16, norm_eps=1e-5,
                               init_std=0.5, lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=1.0),
                     Topology(ranks=2, micro_batches=1, micro_batch_size=1))  # fmt: skip

_CHILD = """
import json
import sys
import numpy as np
np.seterr(all="ignore")  # the device bodies run as numpy emulation here
from open1b.deterministic.cuda import SIMULATED, CudaBackend
from open1b.deterministic.device import DeviceChoice
from open1b.deterministic.replay import replay
assert SIMULATED
device = DeviceChoice("cuda", 0, "cuda/sm_52", "the simulator", (), CudaBackend())
r = replay(sys.argv[1], int(sys.argv[2]), device=device)
print(json.dumps({"pre": r.pre_state.hex(), "post": r.post_state.hex(), "witness": r.witness.hex()}))
"""


def test_a_device_replay_reads_the_checkpoint_in_pieces_and_gives_the_cpu_s_bits(tmp_path, monkeypatch):
    monkeypatch.setitem(PRESETS, "micro-bytes", MICRO_BYTES)
    run_dir = tmp_path / "run"
    manifest = publish_run(run_dir, Identity(blake2b256(b"tests/replay-on-device")), steps=2, seed=3,
                           preset="micro-bytes")  # fmt: skip
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "PYTHONPATH": os.pathsep.join([root, *filter(None, sys.path)])}
    out = subprocess.run([sys.executable, "-c", _CHILD, str(run_dir), "1"], env=env, capture_output=True, text=True,
                         timeout=900, cwd=root)  # fmt: skip
    assert out.returncode == 0, out.stderr[-4000:]
    device = json.loads(out.stdout.strip().splitlines()[-1])
    cpu = replay(run_dir, 1, manifest)
    assert cpu.match
    assert device == {"pre": cpu.pre_state.hex(), "post": cpu.post_state.hex(), "witness": cpu.witness.hex()}
    assert device["post"] == manifest.state_hashes[2].hex()
