"""GPU check (issue 3): are the CUDA kernels bit-identical to the CPU kernels on a real GPU, and
how fast are they next to PyTorch on the same GPU?

    .venv/bin/python bench/gpu_check.py [--preset small] [--steps 2] [--repeats 5]

1. Every op of the backend on the preset's shapes (matmul in all four transpose modes, RMSNorm,
   heads, causal softmax, GELU, cross-entropy, embedding and its scatter-add, the sums, AdamW),
   computed by :class:`open1b.deterministic.cuda.CudaBackend` and by the CPU backend from the same
   inputs; the SHA-256 of every output must be equal. A mismatch prints the first differing
   element of each output.
2. ``--steps`` full ``train_step`` calls from the same state on both, compared by state hash (the
   self-check's known-answer step first, then the preset).
3. Timings on the GPU (after a warm-up call, with ``cuda.synchronize``): each op and the whole
   step, next to torch on the same device when torch has CUDA (matmul → ``torch.matmul``, the
   step → :mod:`open1b.deterministic.torch_twin` in float32). Bit identity is the point; speed is
   reported as a ratio to torch and not a pass criterion.

Exit status: 0 when every hash matches, 1 on any mismatch, 2 when no GPU is usable. Writes
bench/results/gpu_check.json. It also runs under ``NUMBA_ENABLE_CUDASIM=1`` with
``--preset micro`` (slow: every thread is a Python thread), which is how the script itself is
checked on machines without a GPU.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
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
        be.scatter_add(dwte, dx, tokens)  # in place; the tokens stay on the host (it sorts them there)
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
    ]  # fmt: skip


def to_host(be, outputs) -> list[np.ndarray]:
    return [np.asarray(o) if isinstance(o, (np.floating, float)) else be.download(o) for o in outputs]


def check_ops(config, topology, cpu, gpu, seed: int) -> list[dict]:
    rows = []
    for name, inputs, fn in op_cases(config, topology, np.random.default_rng(seed)):
        want = to_host(cpu, fn(cpu, *[x.copy() for x in inputs]))  # copies: some ops write their input
        got = to_host(gpu, fn(gpu, *[gpu.upload(x) for x in inputs]))
        same = [sha(a) == sha(b) for a, b in zip(want, got)]
        row = {"op": name, "match": all(same) and len(want) == len(got)}
        if not row["match"]:
            row["differences"] = [first_difference(a, b) for a, b, ok in zip(want, got, same) if not ok]
        rows.append(row)
    return rows


def check_steps(name: str, config, topology, batches, cpu, gpu) -> dict:
    from open1b.deterministic import init_state, train_step
    from open1b.deterministic.selfcheck import state_fingerprint

    fingerprints = {}
    for label, be in (("cpu", cpu), ("gpu", gpu)):
        state = init_state(config, 7)
        for batch in batches:
            state, _ = train_step(state, batch, topology, backend=be)
        fingerprints[label] = state_fingerprint(state)
    return {"step": name, "steps": len(batches), **fingerprints, "match": fingerprints["cpu"] == fingerprints["gpu"]}


def gpu_timings(config, topology, gpu, repeats: int, seed: int) -> list[dict]:
    """Each op and the whole step on the GPU, and torch's equivalents where torch has CUDA."""
    from numba import cuda

    from open1b.deterministic import batch_for_step, builtin_dataset, init_state, torch_twin, train_step

    def clock(fn) -> float:
        fn()
        cuda.synchronize()
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            cuda.synchronize()
            best = min(best, time.perf_counter() - t)
        return best

    rows = []
    for name, inputs, fn in op_cases(config, topology, np.random.default_rng(seed)):
        args = [gpu.upload(x) for x in inputs]  # transfers stay outside the clock
        rows.append({"what": name, "ours_s": clock(lambda fn=fn, args=args: fn(gpu, *args))})
    state = init_state(config, 0)
    batch = batch_for_step(builtin_dataset(config), 0, 0, config, topology)
    step = {"what": "train_step", "ours_s": clock(lambda: train_step(state, batch, topology, backend=gpu))}
    try:
        import torch

        if torch.cuda.is_available():
            n, d, f = topology.micro_batch_size * config.seq_len, config.d_model, config.d_ff
            a, w = torch.randn(n, d, device="cuda"), torch.randn(d, f, device="cuda")
            mm = next(row for row in rows if row["what"] == "matmul x@w")
            mm["torch_s"] = clock(lambda: (torch.matmul(a, w), torch.cuda.synchronize()))
            tp = {k: t.detach().cuda().requires_grad_() for k, t in torch_twin.to_torch(state.params, torch.float32).items()}
            opt = torch_twin.optimizer(tp, config)
            step["torch_s"] = clock(lambda: (torch_twin.train_step(tp, opt, batch, config), torch.cuda.synchronize()))
    except ImportError:
        pass
    rows.append(step)
    for row in rows:
        if "torch_s" in row:
            row["ratio_vs_torch"] = row["ours_s"] / row["torch_s"]
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small", help="a preset name, or 'micro' for the simulator")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-timing", action="store_true")
    args = parser.parse_args()

    from numba import cuda

    from open1b.deterministic import PRESETS, GPTConfig, Topology, batch_for_step, builtin_dataset
    from open1b.deterministic.backend import cpu_backend
    from open1b.deterministic.cuda import SIMULATED, CudaBackend
    from open1b.deterministic.selfcheck import KNOWN_ANSWER_CONFIG, KNOWN_ANSWER_TOPOLOGY, known_answer_batch

    if not SIMULATED and not cuda.is_available():
        print("gpu_check: no CUDA device is usable here", file=sys.stderr)
        return 2
    if SIMULATED:
        np.seterr(all="ignore")  # the device bodies run as numpy emulation in the simulator
    if args.preset == "micro":
        config = GPTConfig(vocab_size=16, seq_len=4, d_model=8, n_layers=1, n_heads=2, d_ff=16, norm_eps=1e-5,
                           init_std=0.5, lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=1.0)  # fmt: skip
        topology = Topology(2, 1, 1)
        batches = [(np.arange(10) * 7 % 16 + k).astype(np.int32).reshape(2, 1, 1, 5) % 16 for k in range(args.steps)]
    else:
        config, topology = PRESETS[args.preset].config, PRESETS[args.preset].topology
        batches = [batch_for_step(builtin_dataset(config), 0, k, config, topology) for k in range(args.steps)]
    cpu, gpu = cpu_backend(True), CudaBackend()
    name = "simulator" if SIMULATED else cuda.get_current_device().name
    device = name.decode() if isinstance(name, bytes) else str(name)
    report = {"device": device, "preset": args.preset, "ops": check_ops(config, topology, cpu, gpu, args.seed)}
    report["steps"] = [
        check_steps("known-answer", KNOWN_ANSWER_CONFIG, KNOWN_ANSWER_TOPOLOGY, [known_answer_batch(k) for k in range(2)], cpu, gpu)
        if args.preset != "micro" else None,
        check_steps(args.preset, config, topology, batches, cpu, gpu),
    ]  # fmt: skip
    report["steps"] = [s for s in report["steps"] if s]
    if not args.no_timing and not SIMULATED:
        report["timings"] = gpu_timings(config, topology, gpu, args.repeats, args.seed)
    ok = all(r["match"] for r in report["ops"]) and all(s["match"] for s in report["steps"])
    report["all_match"] = ok

    print(f"device: {device}   preset: {args.preset}")
    for r in report["ops"]:
        print(f"  {'ok  ' if r['match'] else 'DIFF'} {r['op']}" + "".join(f"\n         {d}" for d in r.get("differences", [])))
    for s in report["steps"]:
        print(f"  {'ok  ' if s['match'] else 'DIFF'} train_step x{s['steps']} ({s['step']}): cpu {s['cpu'][:16]} gpu {s['gpu'][:16]}")
    for t in report.get("timings", []):
        theirs = f"   torch {t['torch_s'] * 1e3:9.3f} ms   ratio {t['ratio_vs_torch']:.2f}" if "torch_s" in t else ""
        print(f"  {t['what']:<26} ours {t['ours_s'] * 1e3:9.3f} ms{theirs}")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
