"""Engine benchmarks (issue 3): every number is measured against a baseline in the same run.

    .venv/bin/python bench/engine_bench.py [--repeats 7] [--threads 2] [--quick]
    .venv/bin/python bench/engine_bench.py --preset gpt-125m   # one large step and its memory

* step: one ``small`` training step (forward, backward, clipping, AdamW) of the deterministic
  engine vs PyTorch eager float32 on the same model, batch, machine and thread count
  (:mod:`open1b.deterministic.torch_twin`); ``ratio_vs_torch`` = our wall time / torch's
  (medians), and the same on one thread by CPU time.
* matmul: GFLOP/s of the fixed-order matmul vs ``torch.matmul`` on the small model's shapes,
  1 thread (by the thread's CPU clock, which other processes on the machine barely disturb) and
  N threads (wall clock).
* memory: peak resident memory of one small step above the process's resting size, vs the
  analytic minimum (parameters + gradients + Adam moments + the activations the backward keeps).
* compile: cold numba compile of every kernel a tiny step uses (fresh cache), and the warm load.
* estimates: memory and CPU time per step of the 125M and 1B shapes, from the measured rates.

Compile time is kept out of every timed region (each timed function runs once before timing).
Writes bench/results/step.json (the step alone) and bench/results/engine.json (everything).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def timed_pair(ours, theirs, repeats: int, clock=time.perf_counter) -> tuple[list[float], list[float]]:
    """Alternate the two (after one warm-up call each), so that a change in the machine's load
    during the run affects both alike."""
    ours(), theirs()
    a, b = [], []
    for _ in range(repeats):
        for fn, out in ((ours, a), (theirs, b)):
            t = clock()
            fn()
            out.append(clock() - t)
    return a, b


def step_flops(config, topology) -> float:
    """Model FLOPs of one step: 6 per parameter per token for the matrices, plus attention's
    four T x T x d products (forward 2, backward 4 per the Q/K/V/P structure) per layer."""
    tokens = topology.sequences * config.seq_len
    matrices = config.n_params() - config.seq_len * config.d_model  # position table is a lookup
    attention = 12 * topology.sequences * config.seq_len**2 * config.d_model * config.n_layers
    return 6.0 * matrices * tokens + attention


def bench_step(repeats: int, threads: int) -> dict:
    import numpy as np
    import torch

    from open1b.deterministic import PRESETS, batch_for_step, builtin_dataset, init_state, torch_twin, train_step
    from open1b.deterministic.backend import cpu_backend

    preset = PRESETS["small"]
    config, topology = preset.config, preset.topology
    state = init_state(config, 0)
    batch = batch_for_step(builtin_dataset(config), 0, 0, config, topology)
    be = cpu_backend(threads > 1)
    torch.set_num_threads(threads)
    tp = torch_twin.to_torch(state.params, torch.float32)
    opt = torch_twin.optimizer(tp, config)
    ours, theirs = timed_pair(lambda: train_step(state, batch, topology, backend=be),
                              lambda: torch_twin.train_step(tp, opt, batch, config), repeats)  # fmt: skip

    # One thread each, timed by the calling thread's CPU clock: the serial kernels and torch's
    # single-threaded ops both run in this thread, and CPU time barely moves when other
    # processes share the machine (wall time does).
    torch.set_num_threads(1)
    ours_1t, torch_1t = timed_pair(lambda: train_step(state, batch, topology, backend=cpu_backend(False)),
                                   lambda: torch_twin.train_step(tp, opt, batch, config), repeats,
                                   clock=time.thread_time)  # fmt: skip
    flops = step_flops(config, topology)
    ours_s, torch_s = statistics.median(ours), statistics.median(theirs)
    return {
        "preset": "small", "params": config.n_params(), "tokens": topology.sequences * config.seq_len,
        "threads": threads, "backend": be.name, "repeats": repeats,
        "ours_s": {"median": ours_s, "min": min(ours)}, "torch_s": {"median": torch_s, "min": min(theirs)},
        "ratio_vs_torch": ours_s / torch_s, "ratio_vs_torch_min": min(ours) / min(theirs),
        "ours_gflops": flops / ours_s / 1e9, "torch_gflops": flops / torch_s / 1e9,
        "one_thread_cpu_s": {"ours": statistics.median(ours_1t), "torch": statistics.median(torch_1t)},
        "ratio_vs_torch_one_thread_cpu_time": statistics.median(ours_1t) / statistics.median(torch_1t),
        "loss_ours_first_step": float(train_step(state, batch, topology, backend=be)[1].loss),
        "numpy": np.__version__, "torch": torch.__version__,
    }  # fmt: skip


def bench_large_step(preset_name: str) -> dict:
    """One step of a large preset, ours vs torch eager on the same batch, each timed once by the
    thread's CPU clock on one thread (the stable measure on a shared machine; a large step is
    long enough that one sample is many scheduler quanta). Kernels are compiled by a ``tiny``
    step first, outside the timed region."""
    import torch

    from open1b.deterministic import PRESETS, batch_for_step, builtin_dataset, init_state, torch_twin, train_step
    from open1b.deterministic.backend import cpu_backend

    tiny, preset = PRESETS["tiny"], PRESETS[preset_name]
    be = cpu_backend(False)
    train_step(init_state(tiny.config, 0), batch_for_step(builtin_dataset(tiny.config), 0, 0, tiny.config, tiny.topology),
               tiny.topology, backend=be)  # fmt: skip
    config, topology = preset.config, preset.topology
    state = init_state(config, 0)
    batch = batch_for_step(builtin_dataset(config), 0, 0, config, topology)
    torch.set_num_threads(1)
    t = time.thread_time()
    _, report = train_step(state, batch, topology, backend=be)
    ours = time.thread_time() - t
    tp = torch_twin.to_torch(state.params, torch.float32)
    opt = torch_twin.optimizer(tp, config)
    t = time.thread_time()
    torch_twin.train_step(tp, opt, batch, config)
    theirs = time.thread_time() - t
    return {"preset": preset_name, "params": config.n_params(), "tokens": topology.sequences * config.seq_len,
            "one_thread_cpu_s": {"ours": ours, "torch": theirs}, "ratio_vs_torch_one_thread_cpu_time": ours / theirs,
            "ours_gflops_one_thread": step_flops(config, topology) / ours / 1e9, "loss": float(report.loss)}  # fmt: skip


def bench_matmul(repeats: int, threads: int) -> list[dict]:
    import numpy as np
    import torch

    from open1b.deterministic import PRESETS
    from open1b.deterministic.matmul import DENSE, MATMUL

    c = PRESETS["small"].config
    n = PRESETS["small"].topology.sequences * c.seq_len
    d, f = c.d_model, c.d_ff
    heads = PRESETS["small"].topology.sequences * c.n_heads
    shapes = [("x @ mlp_fc", 1, n, d, f), ("a @ mlp_proj", 1, n, f, d), ("h @ attn_qkv", 1, n, d, 3 * d),
              ("q @ k.T (per head)", heads, c.seq_len, c.head_dim, c.seq_len)]  # fmt: skip
    rng = np.random.default_rng(0)
    rows = []
    for name, batch, m, k, nn in shapes:
        a = rng.standard_normal((batch, m, k)).astype(np.float32)
        b = rng.standard_normal((batch, k, nn)).astype(np.float32)
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        flops = 2.0 * batch * m * k * nn
        row = {"name": name, "shape": [batch, m, k, nn]}
        for t in sorted({1, threads}):
            torch.set_num_threads(t)
            clock = time.thread_time if t == 1 else time.perf_counter  # see bench_step
            ours, theirs = timed_pair(lambda: MATMUL[t > 1](a, b, False, False, DENSE), lambda: torch.matmul(ta, tb),
                                      repeats, clock)  # fmt: skip
            row[f"ours_gflops_{t}t"] = flops / min(ours) / 1e9
            row[f"torch_gflops_{t}t"] = flops / min(theirs) / 1e9
        rows.append(row)
    return rows


def _status_bytes(field: str) -> int:
    """``VmRSS`` (resident now) or ``VmHWM`` (peak resident) of this process, from /proc."""
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith(field + ":"))
    return int(line.split()[1]) * 1024


_MEMORY_CHILD = """
import json, sys
sys.path.insert(0, {bench!r})
from engine_bench import _status_bytes
from open1b.deterministic import PRESETS, batch_for_step, builtin_dataset, init_state, train_step
from open1b.deterministic.backend import cpu_backend
be = cpu_backend({parallel})
tiny = PRESETS["tiny"]  # compiles or loads every kernel with tiny arrays, before the measurement
train_step(init_state(tiny.config, 0), batch_for_step(builtin_dataset(tiny.config), 0, 0, tiny.config, tiny.topology), tiny.topology,
           backend=be)
p = PRESETS[{preset!r}]
state = init_state(p.config, 0)
batch = batch_for_step(builtin_dataset(p.config), 0, 0, p.config, p.topology)
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the peak-resident mark (VmHWM) to the current size
rest = _status_bytes("VmRSS")
new_state, _ = train_step(state, batch, p.topology, backend=be)
print(json.dumps({{"rest": rest, "peak": _status_bytes("VmHWM")}}))
"""


def activation_bytes(config, topology) -> int:
    """What the backward of one micro-batch keeps (gpt.forward_backward's ``saved`` list and the
    head): per layer x, h, q, k, v, att, x_mid, h2 (n x d each), u and gelu(u) (n x d_ff), two
    rstd vectors and P (b·H x T x T); then x, x_f (n x d), rstd_f and the logits (n x V)."""
    b, t = topology.micro_batch_size, config.seq_len
    n, d = b * t, config.d_model
    per_layer = n * (8 * d + 2 * config.d_ff + 2) + b * config.n_heads * t * t
    return 4 * (config.n_layers * per_layer + n * (2 * d + 1 + config.vocab_size))


def analytic_minimum(config, topology) -> dict:
    params = 4 * config.n_params()
    return {"params": params, "grads": params, "adam_moments": 2 * params,
            "activations": activation_bytes(config, topology),
            "total": 4 * params + activation_bytes(config, topology)}  # fmt: skip


def bench_memory(threads: int, preset: str = "small") -> dict:
    from open1b.deterministic import PRESETS

    p = PRESETS[preset]
    child = _MEMORY_CHILD.format(bench=str(Path(__file__).parent), parallel=threads > 1, preset=preset)
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    minimum = analytic_minimum(p.config, p.topology)
    step_peak = got["peak"] - got["rest"]
    # The input state is resident before the step (it is "rest"); the analytic minimum counts it.
    input_state = 3 * minimum["params"]
    return {"preset": preset, "peak_above_rest": step_peak, "input_state": input_state,
            "peak_total": step_peak + input_state, "analytic_minimum": minimum,
            "ratio_vs_minimum": (step_peak + input_state) / minimum["total"]}  # fmt: skip


_COMPILE_CHILD = """
import time
t = time.perf_counter()
from open1b.deterministic import PRESETS, batch_for_step, builtin_dataset, init_state, train_step, require_deterministic_machine
from open1b.deterministic.backend import cpu_backend
be = cpu_backend({parallel})
p = PRESETS["tiny"]
train_step(init_state(p.config, 0), batch_for_step(builtin_dataset(p.config), 0, 0, p.config, p.topology), p.topology, backend=be)
require_deterministic_machine(be)
print(time.perf_counter() - t)
"""


def bench_compile() -> dict:
    out = {}
    for parallel in (False, True):
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "NUMBA_CACHE_DIR": cache}
            runs = [subprocess.run([sys.executable, "-c", _COMPILE_CHILD.format(parallel=parallel)], env=env,
                                   capture_output=True, text=True, check=True) for _ in range(2)]  # fmt: skip
        name = "parallel" if parallel else "serial"
        out[f"{name}_cold_s"], out[f"{name}_warm_s"] = (float(r.stdout.strip().splitlines()[-1]) for r in runs)
    return out


def estimates(step: dict, matmul: list[dict]) -> list[dict]:
    """Per-step memory and CPU time of the large shapes, from this machine's measured rate."""
    from open1b.deterministic import PRESETS

    rate = step["ours_gflops"] * 1e9  # whole-step FLOP/s achieved on the small model
    rows = []
    for name in ("gpt-125m", "gpt-1b"):
        p = PRESETS[name]
        minimum = analytic_minimum(p.config, p.topology)
        flops = step_flops(p.config, p.topology)
        rows.append({"preset": name, "params": p.config.n_params(), "topology": [p.topology.ranks, p.topology.micro_batches, p.topology.micro_batch_size],
                     "tokens_per_step": p.topology.sequences * p.config.seq_len, "state_and_grads_GiB": 4 * minimum["params"] / 2**30,
                     "activations_per_micro_batch_GiB": minimum["activations"] / 2**30, "step_tflop": flops / 1e12,
                     "cpu_hours_per_step_at_measured_rate": flops / rate / 3600})  # fmt: skip
    return rows


def table(results: dict) -> str:
    s = results["step"]
    lines = [f"step (small, {s['params'] / 1e6:.1f}M params, {s['tokens']} tokens, {s['threads']} threads)",
             f"  ours  {s['ours_s']['median']:.3f} s  ({s['ours_gflops']:.0f} GFLOP/s)",
             f"  torch {s['torch_s']['median']:.3f} s  ({s['torch_gflops']:.0f} GFLOP/s)",
             f"  ratio_vs_torch {s['ratio_vs_torch']:.2f}  (best-of: {s['ratio_vs_torch_min']:.2f})",
             f"  1 thread, CPU time: ours {s['one_thread_cpu_s']['ours']:.3f} s, torch {s['one_thread_cpu_s']['torch']:.3f} s,"
             f" ratio {s['ratio_vs_torch_one_thread_cpu_time']:.2f}", "matmul GFLOP/s"]  # fmt: skip
    for r in results["matmul"]:
        cols = "  ".join(f"{k.replace('_gflops_', ' ')} {v:.0f}" for k, v in r.items() if "gflops" in k)
        lines.append(f"  {r['name']:<20} {str(r['shape']):<22} {cols}")
    if "memory" in results:
        m = results["memory"]
        lines.append(f"memory: peak {m['peak_total'] / 2**20:.0f} MiB vs analytic minimum "
                     f"{m['analytic_minimum']['total'] / 2**20:.0f} MiB (x{m['ratio_vs_minimum']:.2f})")  # fmt: skip
    if "compile" in results:
        c = results["compile"]
        lines.append(f"compile (tiny step + self-check, fresh cache): serial {c['serial_cold_s']:.1f} s cold / "
                     f"{c['serial_warm_s']:.1f} s warm, parallel {c['parallel_cold_s']:.1f} s / {c['parallel_warm_s']:.1f} s")  # fmt: skip
    for e in results["estimates"]:
        lines.append(f"estimate {e['preset']}: {e['state_and_grads_GiB']:.1f} GiB state+grads, "
                     f"{e['activations_per_micro_batch_GiB']:.1f} GiB activations/micro-batch, "
                     f"{e['step_tflop']:.0f} TFLOP/step = {e['cpu_hours_per_step_at_measured_rate']:.1f} h on this CPU")  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--quick", action="store_true", help="skip the memory and compile measurements")
    parser.add_argument("--preset", default="small",
                        help="another preset measures only one step vs torch (1 thread, CPU time) and the peak "
                             "memory of one step (what a replay holds) against the analytic minimum, into "
                             "step-<preset>.json")
    args = parser.parse_args()
    os.environ.setdefault("NUMBA_NUM_THREADS", str(args.threads))
    if args.preset != "small":
        one = {"step": bench_large_step(args.preset), "memory": bench_memory(args.threads, args.preset),
               "machine": {"cpu_count": os.cpu_count(), "load_average_1m": os.getloadavg()[0]}}  # fmt: skip
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / f"step-{args.preset}.json").write_text(json.dumps(one, indent=2) + "\n")
        print(json.dumps(one, indent=2))
        return 0
    results = {"step": bench_step(args.repeats, args.threads), "matmul": bench_matmul(args.repeats, args.threads)}
    if not args.quick:
        results["memory"] = bench_memory(args.threads)
        results["compile"] = bench_compile()
    results["estimates"] = estimates(results["step"], results["matmul"])
    results["machine"] = {"cpu_count": os.cpu_count(), "load_average_1m": os.getloadavg()[0]}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "step.json").write_text(json.dumps(results["step"], indent=2) + "\n")
    (RESULTS / "engine.json").write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
