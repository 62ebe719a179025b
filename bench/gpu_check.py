"""GPU check (issue 12): is the engine on CUDA bit-identical to the CPU, and how fast is it next to
PyTorch float32 (TF32 off) and cuBLAS on the same GPU? One prepared script, ~5–8 minutes on an H200.

    python3 bench/gpu_check.py                # on a machine with an NVIDIA GPU
    python bench/gpu_check.py --simulate      # anywhere: numba's CUDA simulator, micro shapes

Sections, in order (the JSON is rewritten after each, so a time-out keeps what was measured):

1. ``device``: :func:`open1b.deterministic.device.select_device` ``("cuda")`` — the fusion,
   subnormal and transcendental probes run by the GPU's kernels and the known-answer step, whose
   state hash must be the CPU's pinned one; and what ``auto`` picks.
2. ``ops``: every op of the backend on the ``small`` shapes (matmul in all four transpose modes and
   the causal variants, RMSNorm, heads, softmax, GELU, cross-entropy, embedding, scatter-add, the
   sums, AdamW), GPU vs CPU by SHA-256 of every output.
3. ``steps``: 3 consecutive ``small`` steps (the GPU's state stays on the device between them) and
   1 ``gpt-125m`` step (one 1024-token sequence, so the CPU side stays short), CPU vs GPU: state
   fingerprints, loss/norm/clip bits and witnesses.
4. ``replay``: a ``tiny`` run trained here on the CPU, every step replayed on the GPU: each must
   match the published state-hash chain and its witness commitment.
5. ``timing``: the issue's table. ``small`` step and ``gpt-125m`` step (8 × 1024 tokens) vs torch
   eager float32 (TF32 off) on the same GPU; the fixed-order matmul's GFLOP/s vs ``torch.matmul``
   (cuBLAS fp32) on the ``small`` and ``gpt-125m`` shapes. Our step is timed in a loop as a trainer
   runs it (state on the device, each witness read one step later, so its hash overlaps the next
   step) and again with the new state read back every step (what a replayer or trainer that
   hashes every state pays). CUDA events; medians; compile time outside the clock. Then the
   ``small`` step again with the fused epilogues off (``small_step_unfused``) and with the memory
   pool off (``small_step_no_pool``), each as a ratio to the default and with its device
   allocations a step (issue 32).
6. ``one_row_device_peak``: two ``gpt-1b-one-row`` steps (one 2048-token row of the ``gpt-1b``
   model) on a fresh pooled backend: per parameter, the most bytes its arrays held at once, the
   pool's footprint and the driver's count of used device memory (issue 32's 24 GB target).
7. ``gpt_1b``: one micro-batch (4 × 2048 tokens) of a ``gpt-1b`` step on the GPU: time, peak device
   memory of the backend's own allocations, against the analytic minimum (parameters, gradients
   and both moments: 16 bytes a parameter), and the whole preset step's time extrapolated.

Exit status: 0 when every bit-identity check passes, 1 on any mismatch, 2 when no GPU is usable.
Writes bench/results/gpu_check.json. ``--simulate`` runs every section end to end under
``NUMBA_ENABLE_CUDASIM=1`` on micro shapes (a tiny model in place of the presets, no torch, no
``gpt-1b``; section 6 on the micro model): it proves the script runs, not any speed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).parent / "results" / "gpu_check.json"


def sha(a) -> str:
    a = np.ascontiguousarray(np.asarray(a))
    return hashlib.sha256(str(a.dtype).encode() + str(a.shape).encode() + a.tobytes()).hexdigest()


def first_difference(a: np.ndarray, b: np.ndarray) -> str:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"shape/dtype {a.shape} {a.dtype} vs {b.shape} {b.dtype}"
    diff = np.flatnonzero(a.reshape(-1).view(np.uint8) != b.reshape(-1).view(np.uint8))
    i = diff[0] // a.itemsize
    return f"{diff.size // a.itemsize}+ elements differ, first at flat index {i}: {a.reshape(-1)[i]!r} vs {b.reshape(-1)[i]!r}"


# ---- shapes ---------------------------------------------------------------------------------


def shapes(simulate: bool) -> dict:
    """The models and topologies each section uses (micro ones under the simulator)."""
    from open1b.deterministic import PRESETS, GPTConfig, Topology
    from open1b.deterministic.config import Preset

    if not simulate:
        small, m125 = PRESETS["small"], PRESETS["gpt-125m"]
        return {"ops": small, "steps": small, "big": Preset(m125.config, Topology(1, 1, 1)),
                "time_small": small, "time_big": Preset(m125.config, Topology(1, 1, 8)), "replay_preset": "tiny",
                "gpt_1b": Preset(PRESETS["gpt-1b"].config, Topology(1, 1, 4)), "gpt_1b_full": PRESETS["gpt-1b"],
                "one_row": PRESETS["gpt-1b-one-row"]}  # fmt: skip
    micro = GPTConfig(vocab_size=256, seq_len=4, d_model=8, n_layers=1, n_heads=2, d_ff=16, norm_eps=1e-5,
                      init_std=0.5, lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=1.0)
    one = Preset(micro, Topology(1, 1, 1))
    PRESETS["sim-micro"] = Preset(micro, Topology(2, 1, 1))  # this process only: a preset the simulator can train
    return {"ops": one, "steps": one, "big": one, "time_small": one, "time_big": one, "replay_preset": "sim-micro",
            "gpt_1b": None, "gpt_1b_full": None, "one_row": one}  # fmt: skip


def batches(preset, steps: int) -> list[np.ndarray]:
    from open1b.deterministic import batch_for_step, builtin_dataset

    dataset = builtin_dataset(preset.config)
    return [batch_for_step(dataset, 0, k, preset.config, preset.topology) for k in range(steps)]


# ---- 1. device --------------------------------------------------------------------------------


def check_device(simulated: bool) -> tuple[dict, object]:
    from open1b.deterministic.device import select_device
    from open1b.deterministic.errors import DeviceUnavailableError

    try:
        choice = select_device("cuda")
    except DeviceUnavailableError as exc:
        return {"ok": False, "refused": str(exc)}, None
    out = {"ok": True, "label": choice.label, "class": choice.device_class, "reason": choice.reason,
           "checks": {c.name: [c.ok, c.detail] for c in choice.checks}}
    if not simulated:  # auto probes the device again: seconds on a GPU, minutes in the simulator
        auto = select_device("auto")
        out["auto"] = [auto.label, auto.reason]
    return out, choice


# ---- 2. ops ---------------------------------------------------------------------------------


def op_cases(config, topology, rng) -> list[tuple[str, tuple, object]]:
    """``(name, host inputs, fn(backend, *inputs) -> outputs)`` for every op on the preset's shapes."""
    from open1b.deterministic.attention import attention_scale
    from open1b.deterministic.matmul import A_LOWER, A_UPPER, CAUSAL_OUTPUT
    from open1b.deterministic.optimizer import AdamWScalars

    f32 = np.float32
    b, t, d, f, v, h = (topology.micro_batch_size, config.seq_len, config.d_model, config.d_ff, config.vocab_size,
                        config.n_heads)  # fmt: skip
    n, hd = b * t, config.head_dim
    r = lambda *shape, scale=1.0: (rng.standard_normal(shape) * scale).astype(f32)  # noqa: E731
    eps, scale, inv_n = f32(config.norm_eps), attention_scale(hd), f32(1) / f32(n)
    adam = AdamWScalars.for_step(lr=f32(1e-3), beta1=f32(0.9), beta2=f32(0.95), eps=f32(1e-8), weight_decay=f32(0.1),
                                 beta1_pow=f32(0.9) ** 3, beta2_pow=f32(0.95) ** 3, coef=f32(0.5))  # fmt: skip

    def scatter(be, dwte, dx):
        be.scatter_add(dwte, dx, tokens)  # in place
        return (dwte,)

    def heads(be, qkv):
        parts = [be.split_heads(qkv, i * d, d, t, h) for i in range(3)]
        return (*parts, be.merge_heads(parts[0], t, h), be.merge_qkv(*parts, t, h))

    tokens = rng.integers(0, v, n).astype(np.int32)
    return [
        ("matmul x@w", (r(n, d), r(d, f, scale=0.05)), lambda be, x, w: (be.matmul(x, w),)),
        ("matmul dy@w.T", (r(n, f), r(d, f)), lambda be, x, w: (be.matmul(x, w, False, True),)),
        ("matmul x.T@dy", (r(n, d), r(n, f)), lambda be, x, y: (be.matmul(x, y, True, False),)),
        ("matmul a.T@b.T", (r(d, f), r(n, d)), lambda be, x, y: (be.matmul(x, y, True, True),)),
        ("matmul heads q@k.T", (r(b * h, t, hd), r(b * h, t, hd)), lambda be, q, k: (be.matmul(q, k, False, True),)),
        ("matmul causal q@k.T", (r(b * h, t, hd), r(b * h, t, hd)),
         lambda be, q, k: (be.matmul(q, k, False, True, CAUSAL_OUTPUT),)),
        ("matmul causal p@v", (np.tril(r(b * h, t, t)), r(b * h, t, hd)),
         lambda be, p, v: (be.matmul(p, v, False, False, A_LOWER), be.matmul(p, v, True, False, A_UPPER))),
        ("rmsnorm", (r(n, d), r(d)), lambda be, x, g: be.rmsnorm(x, g, eps)),
        ("rmsnorm_backward", (r(n, d), r(d), np.abs(r(n)), r(n, d), r(n, d)),
         lambda be, x, g, rstd, dy, dres: be.rmsnorm_backward(x, g, rstd, dy, dres)),
        ("heads", (r(n, 3 * d),), heads),
        ("causal_softmax", (r(b * h, t, t, scale=2.0),), lambda be, s: (be.causal_softmax(s, scale),)),
        ("causal_softmax_backward", (np.abs(r(b * h, t, t)), r(b * h, t, t)),
         lambda be, p, dp: (be.causal_softmax_backward(p, dp, scale),)),
        ("gelu", (r(n, f, scale=3.0),), lambda be, u: (be.gelu(u),)),
        ("gelu_backward", (r(n, f, scale=3.0), r(n, f)), lambda be, u, dy: (be.gelu_backward(u, dy),)),
        ("cross_entropy", (r(n, v, scale=2.0), rng.integers(0, v, n).astype(np.int32)),
         lambda be, logits, targets: be.cross_entropy(logits, targets, inv_n)),
        ("embed", (r(v, d), r(t, d), tokens), lambda be, wte, wpe, tok: (be.embed(wte, wpe, tok),)),
        ("scatter_add", (r(v, d), r(n, d)), scatter),
        ("sum_rows", (r(n, d),), lambda be, x: (be.sum_rows(x),)),
        ("sumsq", (r(d, f),), lambda be, x: (be.sumsq(x),)),
        ("add", (r(n, d), r(n, d)), lambda be, x, y: (be.add(x, y), be.plus_zero(x))),
        ("adamw", (r(d, f), r(d, f), r(d, f, scale=0.1), np.abs(r(d, f, scale=0.01))),
         lambda be, p, g, m, v: be.adamw(p, g, m, v, adam)),
        ("clip_norm", (r(d, f), r(d), r(v, d)),
         lambda be, *g: (be.clip_norm(list(g), f32(1.0)),)),
    ]  # fmt: skip


def to_host(be, outputs) -> list[np.ndarray]:
    return [np.asarray(o) if isinstance(o, (np.floating, float, np.ndarray)) else be.download(o) for o in outputs]


def check_ops(preset, cpu, gpu) -> list[dict]:
    rows = []
    for name, inputs, fn in op_cases(preset.config, preset.topology, np.random.default_rng(0)):
        want = to_host(cpu, fn(cpu, *[x.copy() for x in inputs]))  # copies: some ops write their input
        got = to_host(gpu, fn(gpu, *[gpu.upload(x) for x in inputs]))
        same = [sha(a) == sha(b) for a, b in zip(want, got)]
        row = {"op": name, "match": all(same) and len(want) == len(got)}
        if not row["match"]:
            row["differences"] = [first_difference(a, b) for a, b, ok in zip(want, got, same) if not ok]
        rows.append(row)
    return rows


# ---- 3. steps ---------------------------------------------------------------------------------


def run_steps(preset, steps: list[np.ndarray], be) -> list[list[str]]:
    from open1b.deterministic import init_state, train_step
    from open1b.deterministic.selfcheck import state_fingerprint

    out, state = [], init_state(preset.config, 7)
    for batch in steps:
        state, report = train_step(state, batch, preset.topology, backend=be)
        out.append([state_fingerprint(state), sha(np.array([report.loss, report.grad_norm, report.clip_coef])),
                    report.witness.hex()])  # fmt: skip
    return out


def check_steps(name: str, preset, n: int, cpu, gpu) -> dict:
    steps = batches(preset, n)
    t = time.perf_counter()
    want = run_steps(preset, steps, cpu)
    cpu_s = time.perf_counter() - t
    got = run_steps(preset, steps, gpu)
    return {"what": name, "steps": n, "match": want == got, "cpu": [w[0][:16] for w in want],
            "gpu": [g[0][:16] for g in got], "cpu_s": cpu_s}  # fmt: skip


# ---- 4. replay of a CPU-trained run -----------------------------------------------------------


def check_replay(preset_name: str, steps: int, choice) -> dict:
    from open1b.deterministic.replay import replay
    from open1b.deterministic.trainer import publish_run
    from open1b.protocol import Identity
    from open1b.protocol.hashing import blake2b256
    from open1b.protocol.witness import witness_commitment

    with tempfile.TemporaryDirectory() as run_dir:
        manifest = publish_run(Path(run_dir), Identity(blake2b256(b"gpu-check")), steps=steps, seed=3,
                               preset=preset_name)  # fmt: skip
        results = [replay(Path(run_dir), k, manifest, device=choice) for k in range(steps)]
    witnesses = [witness_commitment(r.witness) for r in results] == list(manifest.witnesses)
    return {"preset": preset_name, "steps": steps, "match": all(r.match for r in results) and witnesses,
            "states": [r.match for r in results], "witnesses": witnesses}  # fmt: skip


# ---- 5. timing ----------------------------------------------------------------------------------


def clock(fn, repeats: int, sync) -> float:
    """Median seconds of ``fn`` after one warm-up call, synchronising the device around each call."""
    fn()
    sync()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def time_step(preset, gpu, repeats: int, torch_cuda, read_state: bool = False) -> dict:
    """Per-step seconds of a loop of ``repeats`` steps on the GPU (state on the device; each
    witness read one step later), optionally reading every new state back; and torch's."""
    from numba import cuda

    from open1b.deterministic import init_state, torch_twin, train_step

    steps = batches(preset, 2)
    state = init_state(preset.config, 0)
    state, report = train_step(state, steps[0], preset.topology, backend=gpu)  # compile and warm up
    report.witness
    cuda.synchronize()
    allocations = gpu.allocations
    t = time.perf_counter()
    pending = None
    for _ in range(repeats):
        state, report = train_step(state, steps[1], preset.topology, backend=gpu)
        if pending is not None:
            pending.witness  # the previous step's hash overlapped this step
        if read_state:
            state.params["wte"]  # the whole state comes back in one transfer
        pending = report
    pending.witness
    cuda.synchronize()
    row = {"ours_s": (time.perf_counter() - t) / repeats, "allocations_per_step": (gpu.allocations - allocations) / repeats,
           "fused": gpu.fused, "pool": gpu.pool is not None}  # fmt: skip
    if torch_cuda is not None:
        torch = torch_cuda
        tp = {k: t.detach().cuda().requires_grad_() for k, t in torch_twin.to_torch(
            init_state(preset.config, 0).params, torch.float32).items()}  # fmt: skip
        opt = torch_twin.optimizer(tp, preset.config)

        def torch_step():
            opt.zero_grad(set_to_none=True)
            torch_twin.loss_and_grads(tp, steps[1], preset.config)
            torch.nn.utils.clip_grad_norm_(list(tp.values()), preset.config.grad_clip)
            opt.step()

        row["torch_s"] = clock(torch_step, repeats, torch.cuda.synchronize)
        row["ratio_vs_torch"] = row["ours_s"] / row["torch_s"]
    return row


def matmul_cases(config, topology) -> list[tuple[str, int, int, int, bool, bool]]:
    n, d, f, v = topology.micro_batch_size * config.seq_len, config.d_model, config.d_ff, config.vocab_size
    return [("x@w_fc", n, f, d, False, False), ("dy@w_fc.T", n, d, f, False, True), ("x.T@dy", d, f, n, True, False),
            ("qkv", n, 3 * d, d, False, False), ("logits x@wte.T", n, v, d, False, True)]


def time_matmuls(name: str, preset, gpu, repeats: int, torch_cuda) -> list[dict]:
    from numba import cuda

    rows, rng = [], np.random.default_rng(0)
    for what, m, n, k, ta, tb in matmul_cases(preset.config, preset.topology):
        a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
        b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
        da, db = gpu.upload(a), gpu.upload(b)
        flops = 2.0 * m * n * k
        row = {"model": name, "what": what, "m": m, "n": n, "k": k}
        row["ours_gflops"] = flops / clock(lambda: gpu.matmul(da, db, ta, tb), repeats, cuda.synchronize) / 1e9
        if torch_cuda is not None:
            ta_, tb_ = torch_cuda.from_numpy(a).cuda(), torch_cuda.from_numpy(b).cuda()
            op = lambda: torch_cuda.matmul(ta_.T if ta else ta_, tb_.T if tb else tb_)  # noqa: E731
            row["cublas_gflops"] = flops / clock(op, repeats, torch_cuda.cuda.synchronize) / 1e9
            row["ratio_vs_cublas"] = row["ours_gflops"] / row["cublas_gflops"]
        rows.append(row)
    return rows


def torch_on_cuda():
    """torch with CUDA and TF32 off (so its float32 products are float32), else None."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    return torch


# ---- 6. gpt-1b ------------------------------------------------------------------------------------


def gpt_1b(preset, full, gpu) -> dict:
    from numba import cuda

    from open1b.deterministic import init_state, train_step

    config = preset.config
    state = init_state(config, 0)
    batch = batches(preset, 1)[0]
    gpu.reset_peak()
    state_dev, report = train_step(state, batch, preset.topology, backend=gpu)  # includes compile of new shapes
    report.witness
    cuda.synchronize()
    del state_dev, report
    base = gpu.reset_peak()
    t = time.perf_counter()
    new_state, report = train_step(state, batch, preset.topology, backend=gpu)
    report.witness
    cuda.synchronize()
    seconds = time.perf_counter() - t
    minimum = 16 * config.n_params()
    micro = full.topology.ranks * full.topology.micro_batches * full.topology.micro_batch_size // preset.topology.sequences
    return {"params": config.n_params(), "tokens": preset.topology.sequences * config.seq_len, "step_s": seconds,
            "peak_bytes": gpu.peak_bytes, "resident_before_bytes": base, "analytic_minimum_bytes": minimum,
            "peak_over_minimum": gpu.peak_bytes / minimum,
            "full_step_estimate_s": seconds * micro,
            "note": f"one micro-batch of {preset.topology.sequences} sequences; the preset's step has {micro} "
                    "such micro-batches (estimate: that many times this, the update counted each time)"}  # fmt: skip


def device_peak(preset, index: int) -> dict:
    """Two steps of ``preset`` on a fresh pooled backend (the second from the state the first left
    on the device, as a trainer's loop runs): the most bytes its arrays held at once, the pool's
    footprint (every block it holds: what the device gives this backend), and the driver's count
    of used device memory (numba's module and launch caches included), each per parameter."""
    from numba import cuda

    from open1b.deterministic import init_state, train_step
    from open1b.deterministic.cuda import SIMULATED, CudaBackend

    be = CudaBackend(index)

    def used() -> int | None:
        if SIMULATED:
            return None
        free, total = cuda.current_context().get_memory_info()
        return total - free

    before = used()
    state, n = init_state(preset.config, 0), preset.config.n_params()
    rows = []
    for batch in batches(preset, 2):
        t = time.perf_counter()
        allocated = be.allocations
        state, report = train_step(state, batch, preset.topology, backend=be)
        report.witness
        cuda.synchronize()
        after = used()
        rows.append({"step_s": time.perf_counter() - t, "allocations": be.allocations - allocated,
                     "live_peak_bytes_per_param": be.peak_bytes / n,
                     "pool_bytes_per_param": be.pool.pooled_bytes / n,
                     "device_used_bytes_per_param": None if after is None else (after - before) / n})  # fmt: skip
    return {"params": n, "tokens": preset.topology.sequences * preset.config.seq_len, "steps": rows,
            "target": "24 GB device for a gpt-1b step (issue 32): 26 bytes a parameter"}


# ---- main ---------------------------------------------------------------------------------------


def write(report: dict) -> None:
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2, default=str) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--simulate", action="store_true", help="run under numba's CUDA simulator, micro shapes")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--skip-1b", action="store_true")
    args = parser.parse_args()
    if args.simulate and os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":  # a process-wide switch: set before numba loads
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"})

    from numba import cuda

    from open1b.deterministic.backend import cpu_backend
    from open1b.deterministic.cuda import SIMULATED

    if not SIMULATED and not cuda.is_available():
        print("gpu_check: no CUDA device is usable here", file=sys.stderr)
        return 2
    if SIMULATED:
        np.seterr(all="ignore")  # the device bodies run as numpy emulation in the simulator
    started = time.perf_counter()
    plan = shapes(SIMULATED)
    report: dict = {"simulated": SIMULATED}
    report["device"], choice = check_device(SIMULATED)
    write(report)
    print(f"device: {report['device'].get('label')} {report['device'].get('class')} — "
          f"{report['device'].get('reason') or report['device'].get('refused')}", flush=True)
    if choice is None:
        return 1
    name = "simulator" if SIMULATED else cuda.get_current_device().name
    report["device"]["name"] = name.decode() if isinstance(name, bytes) else str(name)
    cpu, gpu = cpu_backend(True), choice.cuda_backend

    report["ops"] = check_ops(plan["ops"], cpu, gpu)
    write(report)
    for r in report["ops"]:
        print(f"  {'ok  ' if r['match'] else 'DIFF'} {r['op']}" + "".join(f"\n         {d}" for d in r.get("differences", [])))
    report["steps"] = [check_steps("small x3", plan["steps"], 3, cpu, gpu),
                       check_steps("gpt-125m x1 (1 sequence)", plan["big"], 1, cpu, gpu)]  # fmt: skip
    write(report)
    for s in report["steps"]:
        print(f"  {'ok  ' if s['match'] else 'DIFF'} train_step {s['what']}: cpu {s['cpu']} gpu {s['gpu']}", flush=True)
    report["replay"] = check_replay(plan["replay_preset"], 3, choice)
    write(report)
    print(f"  {'ok  ' if report['replay']['match'] else 'DIFF'} CPU-trained {report['replay']['preset']} run "
          f"replayed on the GPU: states {report['replay']['states']}, witnesses {report['replay']['witnesses']}")
    ok = (all(r["match"] for r in report["ops"]) and all(s["match"] for s in report["steps"])
          and report["replay"]["match"] and report["device"]["ok"])  # fmt: skip
    report["all_match"] = ok
    write(report)

    torch_cuda = torch_on_cuda()
    repeats = 2 if SIMULATED else args.repeats
    report["timing"] = {
        "small_step": time_step(plan["time_small"], gpu, repeats, torch_cuda),
        "small_step_reading_state": time_step(plan["time_small"], gpu, repeats, None, read_state=True),
    }
    write(report)
    # Fused epilogues and the memory pool each off, same process (the kernels are compiled once).
    from open1b.deterministic.cuda import CudaBackend

    for key, options in (("small_step_unfused", {"fused": False}), ("small_step_no_pool", {"pool": False})):
        report["timing"][key] = time_step(plan["time_small"], CudaBackend(choice.index, **options), repeats, None)
        report["timing"][key]["ratio_vs_default"] = report["timing"][key]["ours_s"] / report["timing"]["small_step"]["ours_s"]
    write(report)
    report["timing"]["matmul"] = (time_matmuls("small", plan["time_small"], gpu, repeats, torch_cuda)
                                  + time_matmuls("gpt-125m", plan["time_big"], gpu, repeats, torch_cuda))  # fmt: skip
    write(report)
    report["timing"]["gpt125m_step"] = time_step(plan["time_big"], gpu, max(2, repeats // 3), torch_cuda)
    write(report)
    if not args.skip_1b:
        report["one_row_device_peak"] = device_peak(plan["one_row"], choice.index)
        write(report)
    if plan["gpt_1b"] is not None and not args.skip_1b:
        report["gpt_1b"] = gpt_1b(plan["gpt_1b"], plan["gpt_1b_full"], gpu)
        write(report)
    report["elapsed_s"] = time.perf_counter() - started
    write(report)

    t = report["timing"]
    for key in ("small_step", "small_step_reading_state", "small_step_unfused", "small_step_no_pool", "gpt125m_step"):
        row = t[key]
        theirs = f"   torch {row['torch_s'] * 1e3:9.3f} ms   ratio {row['ratio_vs_torch']:.2f}" if "torch_s" in row else ""
        versus = f"   ÷ default {row['ratio_vs_default']:.2f}" if "ratio_vs_default" in row else ""
        print(f"  {key:<26} ours {row['ours_s'] * 1e3:9.3f} ms{theirs}{versus}   "
              f"{row['allocations_per_step']:.0f} allocations a step")
    for row in t["matmul"]:
        theirs = (f"   cuBLAS {row['cublas_gflops']:9.1f} GFLOP/s   ratio {row['ratio_vs_cublas']:.2f}"
                  if "cublas_gflops" in row else "")  # fmt: skip
        print(f"  matmul {row['model']:<8} {row['what']:<16} ours {row['ours_gflops']:9.1f} GFLOP/s{theirs}")
    if "one_row_device_peak" in report:
        last = report["one_row_device_peak"]["steps"][-1]
        used = last["device_used_bytes_per_param"]
        print(f"  {'gpt-1b-one-row' if not SIMULATED else 'micro one-row'} step 2: {last['step_s']:.2f} s, "
              f"{last['allocations']} allocations; bytes/param: live peak {last['live_peak_bytes_per_param']:.1f}, "
              f"pool {last['pool_bytes_per_param']:.1f}, device used {'-' if used is None else f'{used:.1f}'}")
    if "gpt_1b" in report:
        g = report["gpt_1b"]
        print(f"  gpt-1b micro-batch: {g['step_s']:.2f} s, peak {g['peak_bytes'] / 2**30:.1f} GiB "
              f"({g['peak_over_minimum']:.2f}x the 16 B/param minimum); full step ~{g['full_step_estimate_s']:.0f} s")
    print(f"all bit-identity checks {'pass' if ok else 'FAIL'}; {report['elapsed_s']:.0f} s; wrote {RESULTS}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
