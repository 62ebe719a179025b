"""The CUDA kernels under the numba CUDA simulator against the CPU kernels: every op and a whole
two-rank train_step, bit for bit, at tiny sizes.

The simulator runs each CUDA thread as a Python thread and the device bodies as their numpy
emulation, so this checks the CUDA drivers' logic (indexing, shared-memory staging, the per-thread
fold and tree) — not NVVM's code generation, which ``test_cuda_ptx`` inspects. It is a
process-wide switch, hence the child process."""

import hashlib
import json
import os
import subprocess
import sys

import numpy as np

from open1b.deterministic import matmul
from open1b.deterministic.attention import attention_scale
from open1b.deterministic.backend import cpu_backend
from open1b.deterministic.optimizer import AdamWScalars
from open1b.deterministic.probes import PROBE_INPUTS, probe_cpu
from open1b.deterministic.selfcheck import state_fingerprint
from open1b.deterministic.state import init_state
from open1b.deterministic.step import train_step
from open1b.protocol.witness import WITNESS_SEQUENTIAL, WITNESS_TREE

from .conftest import MICRO, MICRO_TOPOLOGY, F, micro_batch, rand


def _digest(*arrays) -> str:
    h = hashlib.sha256()
    for x in arrays:
        x = np.asarray(x)
        h.update(str(x.dtype).encode() + str(x.shape).encode() + np.ascontiguousarray(x).tobytes())
    return h.hexdigest()[:16]


def op_digests(be) -> dict[str, str]:
    """Each op on fixed inputs (host arrays in, host digests out) through backend ``be``."""
    rng = np.random.default_rng(0)
    up, down = be.upload, be.download
    out = {}
    for ta in (False, True):
        for tb in (False, True):
            a, b = rand(rng, 2, *((45, 5) if ta else (5, 45))), rand(rng, 2, *((9, 45) if tb else (45, 9)))
            out[f"matmul-{ta:d}{tb:d}"] = _digest(down(be.matmul(up(a), up(b), ta, tb)))
    p, v = np.tril(rand(rng, 2, 37, 37)), rand(rng, 2, 37, 3)
    for structure in (matmul.CAUSAL_OUTPUT, matmul.A_LOWER, matmul.A_UPPER):
        trans_a = structure == matmul.A_UPPER
        out[f"matmul-structure-{structure}"] = _digest(down(be.matmul(up(p), up(p if structure == 1 else v), trans_a,
                                                                      structure == 1, structure)))  # fmt: skip
    x, g, dy = rand(rng, 6, 40), rand(rng, 40), rand(rng, 6, 40)
    y, rstd = be.rmsnorm(up(x), up(g), F(1e-5))
    out["rmsnorm"] = _digest(down(y), down(rstd))
    out["rmsnorm_backward"] = _digest(*map(down, be.rmsnorm_backward(up(x), up(g), rstd, up(dy), up(dy))))
    out["sum_rows"] = _digest(down(be.sum_rows(up(rand(rng, 70, 3)))))
    out["sumsq"] = _digest(be.sumsq(up(rand(rng, 100))))
    out["add"] = _digest(down(be.add(up(x), up(dy))), down(be.plus_zero(up(np.concatenate([x, -0.0 * x])))))
    u = rand(rng, 3, 7, scale=3.0)
    out["gelu"] = _digest(down(be.gelu(up(u))), down(be.gelu_backward(up(u), up(u))))
    a, w = up(rand(rng, 3, 40)), up(rand(rng, 7, 40))  # the fused epilogues, x·wᵀ with K over one chunk
    out["matmul_add"] = _digest(down(be.matmul_add(up(u), a, w, False, True)))
    out["matmul_gelu"] = _digest(*map(down, be.matmul_gelu(a, w, False, True)))
    out["matmul_gelu_backward"] = _digest(down(be.matmul_gelu_backward(up(u), a, w, False, True)))
    qkv = rand(rng, 8, 12)
    parts = [be.split_heads(up(qkv), i * 4, 4, 4, 2) for i in range(3)]
    out["heads"] = _digest(*map(down, parts), down(be.merge_heads(parts[0], 4, 2)), down(be.merge_qkv(*parts, 4, 2)))
    s, dp = rand(rng, 2, 35, 35, scale=3.0), rand(rng, 2, 35, 35)
    p = be.causal_softmax(up(s), attention_scale(4))
    out["softmax"] = _digest(down(p), down(be.causal_softmax_backward(p, up(dp), attention_scale(4))))
    logits, targets = rand(rng, 5, 40, scale=3.0), rng.integers(0, 40, 5).astype(np.int32)
    loss, dlogits = be.cross_entropy(up(logits), up(targets), F(1) / F(10))
    out["cross_entropy"] = _digest(np.float32(loss), down(dlogits))
    wte, wpe, tokens = rand(rng, 6, 3), rand(rng, 4, 3), np.array([1, 5, 1, 0, 1, 2, 5, 1], np.int32)
    dwte = up(rand(rng, 6, 3))
    be.scatter_add(dwte, up(rand(rng, 8, 3)), tokens)
    out["embedding"] = _digest(down(be.embed(up(wte), up(wpe), up(tokens))), down(dwte))
    s = AdamWScalars.for_step(lr=F(1e-2), beta1=F(0.9), beta2=F(0.95), eps=F(1e-8), weight_decay=F(0.1),
                              beta1_pow=F(0.9), beta2_pow=F(0.95), coef=F(0.5))  # fmt: skip
    pmv = [rand(rng, 4, 5) for _ in range(3)]
    pmv[2] = np.abs(pmv[2])
    out["adamw"] = _digest(*map(down, be.adamw(up(pmv[0]), up(dy[:4, :5].copy()), up(pmv[1]), up(pmv[2]), s)))
    return out


MATMUL_CASES = [  # batch, m, n, k: none a multiple of any tile (the simulator's 4 x 4 blocks, the GPU's 64 x 64, K_CHUNK)
    (1, 5, 6, 330, [(False, False), (True, True)]),  # 11 chunks (0b1011): register levels and the upper stack
    (2, 9, 7, 45, [(False, False), (False, True), (True, False), (True, True)]),  # a partial chunk
    (3, 1, 3, 97, [(True, False)]),  # a single row, four chunks (the first push into the upper stack)
]


def matmul_digests(be) -> dict[str, str]:
    """The register-blocked matmul on odd shapes, every transpose mode and structure flag."""
    rng = np.random.default_rng(1)
    out = {}
    for batch, m, n, k, modes in MATMUL_CASES:
        for ta, tb in modes:
            a = rand(rng, batch, *((k, m) if ta else (m, k)))
            b = rand(rng, batch, *((n, k) if tb else (k, n)))
            out[f"{batch}x{m}x{n}x{k}-{ta:d}{tb:d}"] = _digest(be.download(be.matmul(be.upload(a), be.upload(b), ta, tb)))
    t = 41  # causal products: 41 positions, 2 chunks, tiles above, below and straddling the diagonal
    p, v, q = np.tril(rand(rng, 1, t, t)), rand(rng, 1, t, 2), rand(rng, 1, t, 2)
    up = be.upload
    out["causal-qk"] = _digest(be.download(be.matmul(up(q), up(v), False, True, matmul.CAUSAL_OUTPUT)))
    out["lower-pv"] = _digest(be.download(be.matmul(up(p), up(v), False, False, matmul.A_LOWER)))
    out["upper-ptdo"] = _digest(be.download(be.matmul(up(p), up(v), True, False, matmul.A_UPPER)))
    return out


def matmul_reference_digests() -> dict[str, str]:
    """:func:`matmul_digests` by the numpy reference (structure flags change no result there)."""

    class Reference:
        upload = download = staticmethod(lambda x: x)

        @staticmethod
        def matmul(a, b, ta=False, tb=False, structure=matmul.DENSE):
            return matmul.matmul_reference(a, b, ta, tb, structure)

    return matmul_digests(Reference)


def step_fingerprint(be) -> list:
    """Two two-rank steps of the micro model (the cross-rank sum included) through ``be``, the
    second from the state the first returned: each state's fingerprint and report's bits (the
    first step's witness by rule v2, the second's by v1), the host transfers each step made
    (``be.upload``/``be.upload_into`` and ``be.download`` calls) and the device allocations it made
    (``be.allocations``; 0 on the CPU)."""
    transfers, wrapped = {"upload": 0, "download": 0}, []
    for kind, name in (("upload", "upload"), ("upload", "upload_into"), ("download", "download")):
        method = getattr(be, name, None)
        if method is None:  # the CPU has no place to upload into
            continue
        wrapped.append(name)

        def counted(*args, _method=method, _kind=kind):
            transfers[_kind] += 1
            return _method(*args)

        setattr(be, name, counted)
    out, state = [], init_state(MICRO, 5)
    try:
        for step in range(2):
            transfers.update(upload=0, download=0)
            allocated = getattr(be, "allocations", 0)
            state, report = train_step(state, micro_batch(step), MICRO_TOPOLOGY, backend=be,
                                       witness_rule=(WITNESS_TREE, WITNESS_SEQUENTIAL)[step])
            moved = dict(transfers)
            out.append([state_fingerprint(state), _digest(np.float32(report.loss), np.float32(report.grad_norm),
                                                          np.float32(report.clip_coef)), report.witness.hex(), moved,
                        getattr(be, "allocations", 0) - allocated])  # fmt: skip
    finally:
        for name in wrapped:
            delattr(be, name)
    return out


_CHILD = """
import json
import numpy as np
np.seterr(all="ignore")  # the device bodies run as numpy emulation here
from open1b.deterministic.cuda import SIMULATED, CudaBackend
from open1b.deterministic.device import cuda_device_class
from open1b.deterministic.probes import PROBE_INPUTS
device_class = lambda be: cuda_device_class(be.compute_capability)
from tests.deterministic.test_cuda_sim import matmul_digests, op_digests, step_fingerprint
assert SIMULATED
be = CudaBackend()
print(json.dumps({"ops": op_digests(be), "matmul": matmul_digests(be), "step": step_fingerprint(be), "name": be.name,
                  "unfused_unpooled_step": step_fingerprint(CudaBackend(fused=False, pool=False)),
                  "probe": be.probe(PROBE_INPUTS).tolist(), "class": device_class(be)}))
"""


def test_cuda_simulator_matches_cpu_bit_for_bit():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "PYTHONPATH": os.pathsep.join([root, *filter(None, sys.path)])}
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=900, cwd=root)
    assert out.returncode == 0, out.stderr[-4000:]
    sim = json.loads(out.stdout.strip().splitlines()[-1])
    assert sim["name"] == "cuda-simulator"
    assert sim["class"] == "cuda/sm_52"  # the simulator's compute capability
    # The self-checks' probes through the device's kernel give the CPU's answers (which pass).
    # (The known-answer step itself is too slow for the simulator; gpu_check runs it on a GPU.)
    assert sim["probe"] == probe_cpu(PROBE_INPUTS).tolist()
    cpu = cpu_backend(True)
    assert sim["ops"] == op_digests(cpu)
    assert sim["matmul"] == matmul_digests(cpu) == matmul_reference_digests()
    cpu_steps = step_fingerprint(cpu)
    assert [s[:3] for s in sim["step"]] == [s[:3] for s in cpu_steps]  # states, reports and witnesses
    # The device's fused epilogues and memory pool (its defaults), and its separate kernels on
    # numba's allocator: the same states and witnesses.
    unpooled = sim["unfused_unpooled_step"]
    assert [s[:3] for s in unpooled] == [s[:3] for s in cpu_steps]
    # The pool: the first step allocates its blocks, the second nothing; without it, every array
    # of every step is an allocation.
    (first, second), (plain_first, plain_second) = [s[4] for s in sim["step"]], [s[4] for s in unpooled]
    assert first > 0 and second == 0
    assert plain_first >= plain_second > first
    # On the device: step 1 uploads the host state (a tensor at a time: the host never packs it
    # whole), the batch and (once per model) the norm's chunk bounds, step 2 only its batch (the
    # state stayed on the device); neither downloads anything but the witness's one pinned copy
    # (not through download) — the state comes back when it is read.
    tensors = 3 * len(MICRO.param_shapes())
    assert [s[3] for s in sim["step"]] == [{"upload": 2 + tensors, "download": 0}, {"upload": 1, "download": 0}]
