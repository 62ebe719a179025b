"""Fraud proofs at model shapes (issue 28): proof size and the referee's time per op kind, against
a replay of one whole step measured in the same run.

    .venv/bin/python bench/dispute_bench.py [--presets small gpt-125m] [--trace-presets tiny small]
        [--forged-op tiny small] [--sliced gpt-125m] [--computed small gpt-125m gpt-1b] [--repeats 3]

For each preset and each op kind the referee re-executes, one op at the shape the model runs it
(the first layer's, micro-batch rows = micro_batch_size x seq_len), its inputs random normals (the
cost depends on shapes, not values), its output computed by deterministic/'s kernel; a forger's
trace differs from the honest one in one element, and the proof between them is built as a party
would (tests/protocol/dispute_cases.py). Weights and Adam moments are inputs from the state h_k
(1 MiB state chunks, a tensor proof each); everything else comes from earlier ops (64 KiB trace
chunks). Measured: ``proof_bytes`` (the encoded proof), ``referee_s`` (``verify_fraud_proof`` of
those bytes, median CPU time of this thread: it decodes, checks both signatures and every Merkle
path, re-executes the disputed rows), ``replay_s`` (one ``train_step`` of the preset on the serial
kernels, this thread's CPU time, compiled beforehand) and ``referee_vs_replay`` = referee_s /
replay_s per kind, and its maximum over kinds per preset. ``trace_overhead_vs_replay`` (per
``--trace-presets`` preset): what a disputing node runs (``trace_step``: checkpoint k checked,
the streamed step, h_{k+1}) against the same replay untraced, interleaved pairs in this process, on
the product's default kernels (:func:`product_overhead`; ``trace`` also holds the serial
kernels' pairs and the ratios without the scan); ``trace_whole_state`` keeps the older measure,
``train_step(…, trace=OpTrace())`` on a whole state on the serial kernels (:func:`trace_overhead`). ``scenarios["forged-op"]`` and ``rounds`` (per
``--forged-op`` preset): the forged-op dispute at that size (:func:`forged_op`).

``sliced_referee`` (per ``--sliced`` preset, default ``gpt-125m``, and ``--sliced-zero`` preset,
default none): the referee's time on the proofs that carry slices there (a weight and an
attention gradient; with zero operands, the weight gradient alone), against ``small``'s replay
of this run, a lower bound of that preset's replay (:func:`sliced_referee`).
``proof_bytes`` of the ``--computed`` presets above ``small`` (default ``gpt-125m`` and ``gpt-1b``),
and ``proof_bytes_computed`` of each (``small`` included, ``computed_vs_measured_small`` its largest
relative difference from the measured): every op of a step at the preset's shapes, a proof over its
middle element, computed from the shapes by bench/dispute_sizes.py (r27's reads, no tensor).

Writes bench/results/dispute.json (a run that measures one part keeps the file's other parts).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _ops(preset_name: str, rng):
    """(label, kind, inputs, attrs, outputs, state input indices, forged output) at the preset's shapes."""
    import numpy as np

    from open1b.deterministic import PRESETS, activation, attention, loss, matmul, norm, optimizer, reduction
    from open1b.deterministic.attention import attention_scale
    from open1b.protocol.dispute.ops import KINDS
    from tests.protocol.dispute_cases import adamw_scalars, bits

    preset = PRESETS[preset_name]
    c, t = preset.config, preset.topology
    n, d, f, T = t.micro_batch_size * c.seq_len, c.d_model, c.d_ff, c.seq_len
    bh = t.micro_batch_size * c.n_heads

    def randn(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    x, u, dy, w_fc = randn(n, d), randn(n, f, scale=3.0), randn(n, f), randn(d, f, scale=0.02)
    proj = randn(n, d)
    yield "add (residual)", "add", [x, proj], {}, [reduction.KERNELS[False][2](x, proj)], (), 0
    g = randn(d, f, scale=1e-3)
    yield "plus_zero (micro-batch fold)", "plus_zero", [g], {}, [reduction.KERNELS[False][3](g)], (), 0
    yield "gelu", "gelu", [u], {}, [activation.KERNELS[False][0](u)], (), 0
    yield "gelu_backward", "gelu_backward", [u, dy], {}, [activation.KERNELS[False][1](u, dy)], (), 0
    m, v = randn(d, f, scale=1e-3), np.abs(randn(d, f, scale=1e-6))
    s = adamw_scalars()
    attrs = dict(zip(KINDS["adamw"].attrs, map(bits, s.args())))
    yield ("adamw (mlp_fc, p/m/v from the state)", "adamw", [w_fc, g, m, v], attrs,
           list(optimizer.KERNELS[False](w_fc, g, m, v, *s.args())), (0, 2, 3), 0)
    ln = randn(d)
    eps = np.float32(1e-5)
    yield "rmsnorm (gain from the state)", "rmsnorm", [x, ln], {"eps_bits": bits(eps)}, \
        list(norm.KERNELS[False][0](x, ln, eps)), (1,), 0
    scores, scale = randn(bh, T, T, scale=3.0), attention_scale(c.head_dim)
    yield "causal_softmax", "causal_softmax", [scores], {"scale_bits": bits(scale)}, \
        [attention.KERNELS[False][3](scores, scale)], (), 0
    dense = {"trans_a": 0, "trans_b": 0, "structure": 0}
    yield "matmul x @ mlp_fc (weight from the state)", "matmul", [x, w_fc], dense, \
        [matmul.MATMUL[False](x[None], w_fc[None], False, False, 0)[0]], (1,), 0
    yield "matmul x.T @ du (a weight gradient)", "matmul", [x, dy], {**dense, "trans_a": 1}, \
        [matmul.MATMUL[False](x[None], dy[None], True, False, 0)[0]], (), 0
    logits = randn(n, c.vocab_size, scale=3.0)
    targets = rng.integers(0, c.vocab_size, n).astype(np.int32)
    inv_n = np.float32(1) / np.float32(t.sequences * T)
    total, dlogits = loss.KERNELS[False](logits, targets, inv_n)
    yield "cross_entropy (dlogits)", "cross_entropy", [logits, targets], {"inv_n_bits": bits(inv_n)}, \
        [np.array([total], np.float32), dlogits], (), 1
    yield "cross_entropy (loss)", "cross_entropy", [logits, targets], {"inv_n_bits": bits(inv_n)}, \
        [np.array([total], np.float32), dlogits], (), 0


def _more_ops(preset_name: str, rng):
    """The backward's row kernels, the column sums, the embedding both ways, the head copies,
    clipping and zeros, at the preset's shapes (same conventions as :func:`_ops`)."""
    import numpy as np

    from open1b.deterministic import PRESETS, attention, backend, embedding, norm, reduction
    from open1b.deterministic.attention import attention_scale
    from tests.protocol.dispute_cases import bits

    preset = PRESETS[preset_name]
    c, t = preset.config, preset.topology
    n, d, T, H = t.micro_batch_size * c.seq_len, c.d_model, c.seq_len, c.n_heads

    def randn(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    x, ln, dy, dres = randn(n, d), randn(d), randn(n, d), randn(n, d)
    _, rstd = norm.KERNELS[False][0](x, ln, np.float32(1e-5))
    yield "rmsnorm_backward (gain from the state)", "rmsnorm_backward", [x, ln, rstd, dy, dres], {}, \
        list(norm.KERNELS[False][1](x, ln, rstd, dy, dres)), (1,), 0
    scale = attention_scale(c.head_dim)
    p = attention.KERNELS[False][3](randn(t.micro_batch_size * H, T, T, scale=3.0), scale)
    dp = randn(*p.shape)
    yield "causal_softmax_backward", "causal_softmax_backward", [p, dp], {"scale_bits": bits(scale)}, \
        [attention.KERNELS[False][4](p, dp, scale)], (), 0
    yield "sum_rows (a gain's gradient)", "sum_rows", [dy], {}, [reduction.KERNELS[False][0](dy)], (), 0
    wte, wpe = randn(c.vocab_size, d, scale=0.02), randn(T, d, scale=0.02)
    tokens = rng.integers(0, c.vocab_size, n).astype(np.int32)
    yield "embed (tables from the state)", "embed", [wte, wpe, tokens], {}, \
        [embedding.KERNELS[False][0](wte, wpe, tokens)], (0, 1), 0
    dwte = randn(c.vocab_size, d, scale=1e-3)
    out = dwte.copy()
    embedding.KERNELS[False][1](out, dy, *embedding.positions_by_token(tokens, c.vocab_size))
    yield "scatter_add (the tied table's gradient)", "scatter_add", [dwte, dy, tokens], {}, [out], (), 0
    qkv = randn(n, 3 * d)
    split, merge = attention.KERNELS[False][0], attention.KERNELS[False][1]
    yield "split_heads (k of qkv)", "split_heads", [qkv], {"col0": d, "width": d, "seq_len": T, "n_heads": H}, \
        [split(qkv, d, d, T, H)], (), 0
    o = randn(t.micro_batch_size * H, T, c.head_dim)
    yield "merge_heads", "merge_heads", [o], {"seq_len": T, "n_heads": H}, [merge(o, T, H)], (), 0
    be = backend.cpu_backend(False)
    g = randn(d, 4 * d, scale=1e-3)
    yield "sumsq (mlp_fc's gradient)", "sumsq", [g], {}, [np.array([be.sumsq(g)], np.float32)], (), 0
    grads = [randn(64, scale=0.1) for _ in range(4 + 6 * c.n_layers)]  # one per parameter: clip reads their sums
    sums = [np.array([be.sumsq(gi)], np.float32) for gi in grads]
    yield "clip (one sum per parameter)", "clip", sums, {"max_norm_bits": bits(1.0)}, \
        [be.clip_norm(grads, np.float32(1.0))], (), 0
    yield "zeros", "zeros", [], {"rows": n, "cols": d}, [np.zeros((n, d), np.float32)], (), 0


def replay_seconds(preset_name: str) -> float:
    """One step of the preset on the serial kernels, this thread's CPU time (a tiny step compiles first)."""
    from open1b.deterministic import PRESETS, batch_for_step, builtin_dataset, init_state, train_step
    from open1b.deterministic.backend import cpu_backend

    tiny, preset = PRESETS["tiny"], PRESETS[preset_name]
    be = cpu_backend(False)
    train_step(init_state(tiny.config, 0), batch_for_step(builtin_dataset(tiny.config), 0, 0, tiny.config,
                                                          tiny.topology), tiny.topology, backend=be)  # fmt: skip
    config, topology = preset.config, preset.topology
    state = init_state(config, 0)
    batch = batch_for_step(builtin_dataset(config), 0, 0, config, topology)
    start = time.thread_time()
    train_step(state, batch, topology, backend=be)
    return time.thread_time() - start


def trace_overhead(preset_name: str, repeats: int) -> dict:
    """A traced replay (deterministic/op_trace.py inside train_step) against the same replay
    untraced, in this run: ``repeats`` alternated pairs on the serial kernels, process CPU time
    (every thread: the witness's and the state's chunk hashing count) and wall time, the median of
    the pairs' ratios. A replay is the step and its result h_{k+1}
    (:func:`~open1b.deterministic.dispute_replay.state_hash_of_chunks`: every chunk of the new
    state hashed on every core), the traced one taking the update's outputs' chunk digests from
    its trace (§18.1, r20) as ``trace_step`` does. The state inputs' roots are given, as a replay
    that verified checkpoint k against h_k has hashed every state tensor already;
    ``state_roots_s`` is what hashing them again would add. ``step_only`` is the ratio of the
    steps alone, h_{k+1} left out (the traced step then holds the update's state-tree hashing).
    The traced replay's bits and h_{k+1} are checked against the plain one's."""
    from open1b.deterministic import PRESETS, batch_for_step, builtin_dataset, init_state, train_step
    from open1b.deterministic.backend import cpu_backend
    from open1b.deterministic.dispute_replay import state_hash_of_chunks
    from open1b.deterministic.op_trace import OpTrace
    from open1b.protocol.dispute.trace import chunk_tree

    preset = PRESETS[preset_name]
    config, topology = preset.config, preset.topology
    state = init_state(config, 0)
    batch = batch_for_step(builtin_dataset(config), 0, 0, config, topology)
    be = cpu_backend(False)
    plain_state, _ = train_step(state, batch, topology, backend=be)  # compiled before timing
    h_k = bytes(32)  # the link to h_k costs one small hash; both sides use the same
    plain_post = state_hash_of_chunks(h_k, plain_state, batch, {})
    start = time.process_time()
    roots = {name: chunk_tree(memoryview(a.reshape(-1)).cast("B"), state=True).root
             for name, a in state.tensors().items()}
    state_roots_s = time.process_time() - start
    cpu, wall, step_cpu, post_cpu = ({"plain": [], "traced": []} for _ in range(4))
    ops = 0
    for _ in range(repeats):
        for name in ("plain", "traced"):
            trace = OpTrace(state_roots=roots) if name == "traced" else None
            c0, w0 = time.process_time(), time.perf_counter()
            new_state, report = train_step(state, batch, topology, backend=be, trace=trace)
            report.witness  # the step is done when its witness is
            c1 = time.process_time()
            post = state_hash_of_chunks(h_k, new_state, batch, {} if trace is None else trace.post_chunks)
            if trace is not None:
                ops = trace.ops
                trace.tree()  # the root, once per step
            c2 = time.process_time()
            cpu[name].append(c2 - c0)
            wall[name].append(time.perf_counter() - w0)
            step_cpu[name].append(c1 - c0)
            post_cpu[name].append(c2 - c1)
            assert post == plain_post, "tracing changed h_{k+1}"
        same = all(new_state.tensors()[k].tobytes() == t.tobytes() for k, t in plain_state.tensors().items())
        assert same, "tracing changed the step"

    def ratio(times: dict) -> float:
        return statistics.median(t / p for t, p in zip(times["traced"], times["plain"])) - 1

    return {"ops": ops, "pairs": repeats, "plain_cpu_s": statistics.median(cpu["plain"]),
            "traced_cpu_s": statistics.median(cpu["traced"]), "trace_overhead_vs_replay": ratio(cpu),
            "trace_overhead_wall": ratio(wall), "step_only": ratio(step_cpu),
            "plain_step_cpu_s": statistics.median(step_cpu["plain"]),
            "post_state_cpu_s": {k: statistics.median(v) for k, v in post_cpu.items()},
            "state_roots_s": state_roots_s, "state_roots_vs_replay": state_roots_s / statistics.median(cpu["plain"])}


def product_overhead(preset_name: str, pairs: int, workdir: Path, kernels=(None,)) -> dict:
    """The trace's overhead on the path a disputing node runs: ``trace_step``'s body (deterministic/
    dispute_replay.py: checkpoint k scanned and checked against h_k, the streamed step traced, h_{k+1}
    from the update's chunk digests the trace hashed) against the same replay untraced
    (:class:`~open1b.deterministic.dispute_replay.DisputeStep` with no trace: the same scan, step and
    h_{k+1}), on step 0 of a run of the preset published in ``workdir``. ``pairs`` pairs, which
    side goes first alternating, in this process, per ``kernels`` entry: serial (False), parallel
    (True) or the product's default (None: parallel from 1M parameters). Process CPU time (every
    thread: the hashing threads count) and wall time; the median of the pairs' ratios and their
    spread. ``step_only`` leaves the scan out of both sides (``scan_cpu_s``: its median). Every
    replay's h_1 must be the published one."""
    from open1b.deterministic.backend import cpu_backend
    from open1b.deterministic.dispute_replay import DisputeStep
    from open1b.deterministic.op_trace import OpTrace
    from open1b.deterministic.runfile import read_manifest
    from open1b.devnet.forged_run import publish_forged_run
    from open1b.protocol import Identity

    publish_forged_run(workdir, Identity(b"\x05" * 32), steps=1, forgeries={}, preset=preset_name)
    manifest = read_manifest(workdir)
    out = {}
    for parallel in kernels:
        backend = None if parallel is None else cpu_backend(parallel)
        ops = 0

        def once(traced: bool) -> tuple[float, float, float]:
            nonlocal ops
            c0, w0 = time.process_time(), time.perf_counter()
            step = DisputeStep(workdir, manifest, 0)  # trace_step's body, with the scan timed apart
            scan = time.process_time() - c0
            trace = OpTrace(state_roots=step.roots) if traced else None
            post = step.run(trace, backend)
            if trace is not None:
                ops = trace.ops
                trace.tree()  # the trace root
            assert post == manifest.state_hashes[1], "a replay missed the published h_1"
            return time.process_time() - c0, time.perf_counter() - w0, scan

        once(False), once(True)  # compiled and warm before timing
        runs: dict[str, list[tuple[float, float, float]]] = {"plain": [], "traced": []}
        for i in range(pairs):
            for name in (("plain", "traced") if i % 2 == 0 else ("traced", "plain")):
                runs[name].append(once(name == "traced"))

        def ratios(of) -> list[float]:
            return sorted(of(t) / of(p) - 1 for t, p in zip(runs["traced"], runs["plain"]))

        cpu, wall, step_only = ratios(lambda r: r[0]), ratios(lambda r: r[1]), ratios(lambda r: r[0] - r[2])
        kind = {None: "default", False: "serial", True: "parallel"}[parallel]
        out[kind] = {"ops": ops, "pairs": pairs, "plain_cpu_s": statistics.median(r[0] for r in runs["plain"]),
                     "traced_cpu_s": statistics.median(r[0] for r in runs["traced"]),
                     "scan_cpu_s": statistics.median(r[2] for r in runs["plain"]),
                     "trace_overhead_vs_replay": statistics.median(cpu),
                     "spread": {"min": cpu[0], "quartiles": statistics.quantiles(cpu, n=4), "max": cpu[-1]},
                     "trace_overhead_wall": statistics.median(wall), "step_only": statistics.median(step_only),
                     "load_average_1m": os.getloadavg()[0]}
    return out


def forged_op(preset_name: str, workdir: Path) -> dict:
    """The ``forged-op`` scenario's dispute at the preset's size, without daemons: a 2-step run
    whose step 1 has one op forged (devnet/forged_op.py), the auditor's and the trainer's traced
    replays of step 1 (deterministic/dispute_replay.py), their bisection over the dispute stream
    between two libp2p hosts on loopback (devnet/disputer.py), and the referee on its proof. The
    devnet scenario (tests/scenarios/test_scenario_fraud_proofs.py, at tiny) adds the gossip and
    the daemons' coverage; here are the sizes and times. ``bisection_wall_s`` includes each
    party's replay to the op for its data (op_data), which dominates."""
    from open1b.devnet.disputer import dispute, party
    from open1b.devnet.forged_op import FORGED_KIND, ForgingBackend
    from open1b.devnet.forged_run import publish_forged_run
    from open1b.protocol import Identity
    from open1b.protocol.dispute.referee import verify_fraud_proof

    trainer, auditor = Identity(b"\x03" * 32), Identity(b"\x04" * 32)
    manifest = publish_forged_run(workdir, trainer, steps=2, forgeries={1: "forged-op"}, preset=preset_name)
    start = time.process_time()
    honest = party(workdir, manifest, 1, auditor, None)
    trace_s = time.process_time() - start
    forger = party(workdir, manifest, 1, trainer, ForgingBackend)
    result, wall = dispute((auditor, honest), (trainer, forger))
    verify_fraud_proof(result.proof)
    start = time.thread_time()
    verdict = verify_fraud_proof(result.proof)
    referee_s = time.thread_time() - start
    assert verdict.accepted and verdict.guilty == (trainer.public_key,) and verdict.op == FORGED_KIND, verdict
    return {"op": verdict.op, "position": verdict.position, "ops": len(honest.records), "proof_bytes": len(result.proof),
            "rounds": result.rounds, "bisection_wall_s": wall, "traced_replay_cpu_s": trace_s, "referee_s": referee_s}


def sliced_referee(preset_name: str, repeats: int, *, zeros: bool = False) -> dict:
    """The referee on the proofs that carry slices (r27) at the preset's shapes: a weight
    gradient xᵀ @ du and an attention gradient pᵀ @ do (every head's scores), its time against
    ``small``'s replay (a lower bound of the preset's) measured in the same run by the caller.
    With ``zeros`` (``--sliced-zero``, for `gpt-1b`, whose product the serial kernel would take
    minutes to compute) the weight gradient alone, its operands +0.0 and so its output (the
    referee's work is the same for any values: it hashes every slice and folds one column pair);
    ~1.3 GB at `gpt-1b`, the op's operands twice over."""
    import numpy as np

    from open1b.deterministic import PRESETS, attention, matmul

    c, t = PRESETS[preset_name].config, PRESETS[preset_name].topology
    n, d, f, T, bh = t.micro_batch_size * c.seq_len, c.d_model, c.d_ff, c.seq_len, t.micro_batch_size * c.n_heads
    weight = {"trans_a": 1, "trans_b": 0, "structure": 0}
    if zeros:
        cases = [("matmul x.T @ du (a weight gradient), zero operands", [np.zeros((n, d), np.float32),
                  np.zeros((n, f), np.float32)], weight, np.zeros((d, f), np.float32))]  # fmt: skip
        return _judged(preset_name, cases, repeats)
    rng = np.random.default_rng(1)
    x, du = rng.standard_normal((n, d)).astype(np.float32), rng.standard_normal((n, f)).astype(np.float32)
    p = attention.KERNELS[False][3](rng.standard_normal((bh, T, T)).astype(np.float32), np.float32(0.125))
    do = rng.standard_normal((bh, T, c.head_dim)).astype(np.float32)
    cases = [("matmul x.T @ du (a weight gradient)", [x, du], weight,
              matmul.MATMUL[False](x[None], du[None], True, False, 0)[0]),
             ("matmul p.T @ do (an attention gradient)", [p, do], {"trans_a": 1, "trans_b": 0, "structure": 3},
              matmul.MATMUL[False](p, do, True, False, 3))]  # fmt: skip
    return _judged(preset_name, cases, repeats)


def _referee_seconds(data: bytes, repeats: int, guilty: bytes) -> float:
    """The referee's median CPU time on proof ``data`` over ``repeats`` runs, after one warm run
    (numpy and the reference module load once); every verdict must convict ``guilty`` alone."""
    from open1b.protocol.dispute.referee import verify_fraud_proof

    verify_fraud_proof(data)
    times = []
    for _ in range(repeats):
        start = time.thread_time()
        verdict = verify_fraud_proof(data)
        times.append(time.thread_time() - start)
        assert verdict.accepted and verdict.guilty == (guilty,), verdict
    return statistics.median(times)


def _judged(preset_name: str, cases: list, repeats: int) -> dict:
    """Proofs of ``cases`` (label, inputs, attrs, output) with the middle element forged, and the
    referee's median CPU time on each."""
    from open1b.protocol import Identity
    from open1b.protocol.dispute.reads import SlicedOpening
    from tests.protocol.dispute_cases import traces_around

    honest, forger = Identity(b"\x01" * 32), Identity(b"\x02" * 32)
    rows = {}
    for label, inputs, attrs, out in cases:
        proof = traces_around("matmul", inputs, attrs, [out], (honest, forger), forge_element=out.size // 2)
        data = proof.encode()
        slices = sum(len(o.slices) for chunks in proof.reads for o in chunks if type(o) is SlicedOpening)
        del proof
        referee_s = _referee_seconds(data, repeats, forger.public_key)
        rows[label] = {"proof_bytes": len(data), "slices": slices, "referee_s": referee_s}
        print(f"{preset_name:9} {label:42} {len(data):>10,} B, {slices:,} slices, referee "
              f"{referee_s * 1e3:.1f} ms", flush=True)
    return rows


def bench_preset(preset_name: str, repeats: int) -> dict:
    import numpy as np

    from open1b.protocol import Identity
    from tests.protocol.dispute_cases import traces_around

    honest, forger = Identity(b"\x01" * 32), Identity(b"\x02" * 32)
    rng = np.random.default_rng(0)
    rows = []
    for label, kind, inputs, attrs, outputs, state, forged in (*_ops(preset_name, rng), *_more_ops(preset_name, rng)):
        element = outputs[forged].size // 2  # an element in the middle
        proof = traces_around(kind, inputs, attrs, outputs, (honest, forger), forge_output=forged,
                              forge_element=element, state_inputs=frozenset(state))
        data = proof.encode()
        referee_s = _referee_seconds(data, repeats, forger.public_key)
        reads = sum(len(o.data) for chunks in proof.reads for o in chunks)
        rows.append({"op": label, "kind": kind, "proof_bytes": len(data), "input_chunk_bytes": reads,
                     "referee_s": referee_s})
        print(f"{preset_name:9} {label:42} {len(data):>10,} B  referee {referee_s * 1e3:8.1f} ms", flush=True)
    replay = replay_seconds(preset_name)
    for row in rows:
        row["referee_vs_replay"] = row["referee_s"] / replay
    print(f"{preset_name:9} replay of one step {replay:.2f} s (CPU, one thread)", flush=True)
    return {"replay_s": replay, "ops": rows, "proof_bytes_max": max(r["proof_bytes"] for r in rows),
            "proof_bytes_median": statistics.median(r["proof_bytes"] for r in rows),
            "referee_vs_replay_max": max(r["referee_vs_replay"] for r in rows)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="*", default=["small", "gpt-125m"], help="proof size and referee time")
    parser.add_argument("--trace-presets", nargs="*", default=["tiny", "small"], help="the trace producer's overhead")
    parser.add_argument("--forged-op", nargs="*", default=["tiny", "small"], help="the forged-op dispute's size and time")
    parser.add_argument("--computed", nargs="*", default=["small", "gpt-125m", "gpt-1b"],
                        help="proof sizes computed from shapes (bench/dispute_sizes.py)")
    parser.add_argument("--sliced", nargs="*", default=["gpt-125m"],
                        help="the referee on proofs that carry slices at these shapes, against small's replay")
    parser.add_argument("--sliced-zero", nargs="*", default=[],
                        help="the same on a weight gradient with zero operands at these shapes (gpt-1b: ~1.3 GB)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=0, help="traced/untraced pairs (default: 21 at tiny, 15 else)")
    args = parser.parse_args()
    import numpy as np

    path = ROOT / "bench" / "results" / "dispute.json"
    out = json.loads(path.read_text()) if path.exists() else {}  # a partial run keeps the other parts
    machine = {"cpu_count": os.cpu_count(), "load_average_1m": os.getloadavg()[0], "numpy": np.__version__}
    if args.presets:
        results = {p: bench_preset(p, args.repeats) for p in args.presets}
        for key in ("proof_bytes", "referee_vs_replay", "presets"):  # other presets keep their last run's
            out.setdefault(key, {})
        for p, res in results.items():
            out["proof_bytes"][p] = {r["kind"] if r["kind"] != "matmul" and r["kind"] != "cross_entropy" else r["op"]:
                                     r["proof_bytes"] for r in res["ops"]}
            out["proof_bytes"][p]["max"] = res["proof_bytes_max"]
            out["referee_vs_replay"][p] = res["referee_vs_replay_max"]
            out["presets"][p] = {**res, "machine": machine}
    if args.sliced:
        out["sliced_referee"] = {p: sliced_referee(p, args.repeats) for p in args.sliced}
    if args.sliced_zero:
        out.setdefault("sliced_referee", {}).update({p: sliced_referee(p, args.repeats, zeros=True)
                                                     for p in args.sliced_zero})
    if args.sliced or args.sliced_zero:
        replay = out.get("presets", {}).get("small", {}).get("replay_s")
        for p, rows in out["sliced_referee"].items():
            for row in rows.values():
                row["referee_vs_small_replay"] = row["referee_s"] / replay if replay else None
    if args.computed:
        from dispute_sizes import computed  # this folder: the script's own, first on sys.path

        sizes = out.setdefault("proof_bytes_computed", {})
        for p in args.computed:
            sizes[p] = computed(p)
            if p != "small":  # small's are measured (above); the rest are these
                out.setdefault("proof_bytes", {})[p] = {label: row["proof_bytes"] for label, row in sizes[p].items()}
                out["proof_bytes"][p]["max"] = max(row["proof_bytes"] for row in sizes[p].values())
            print(f"{p:9} computed proofs: largest {max(r['proof_bytes'] for r in sizes[p].values()):,} B", flush=True)
        if "small" in sizes and "small" in out.get("presets", {}):
            measured = {r["op"]: r["proof_bytes"] for r in out["presets"]["small"]["ops"]}
            out["computed_vs_measured_small"] = max(abs(sizes["small"][k]["proof_bytes"] / v - 1)
                                                    for k, v in measured.items() if k in sizes["small"])
    if args.forged_op:
        import tempfile

        out.setdefault("scenarios", {}).setdefault("forged-op", {})
        out["rounds"] = out.get("rounds") or {}
        for p in args.forged_op:
            with tempfile.TemporaryDirectory() as tmp:
                found = forged_op(p, Path(tmp))
            out["scenarios"]["forged-op"][p] = {**found, "machine": machine}
            out["rounds"][p] = found["rounds"]
            print(f"{p:9} forged-op: {found['op']} at op {found['position']} of {found['ops']}, {found['rounds']} rounds, "
                  f"{found['bisection_wall_s']:.2f} s on loopback, proof {found['proof_bytes']:,} B, referee "
                  f"{found['referee_s'] * 1e3:.1f} ms", flush=True)
    if args.trace_presets:
        import tempfile

        traces, whole = {}, {}
        for p in args.trace_presets:
            pairs = args.pairs or (21 if p == "tiny" else 15)
            with tempfile.TemporaryDirectory() as tmp:
                traces[p] = product_overhead(p, pairs, Path(tmp), kernels=(None, False))
            for kind, t in traces[p].items():
                print(f"{p:9} trace_step's replay, {kind} kernels ({t['ops']} ops, {pairs} pairs): "
                      f"{t['trace_overhead_vs_replay']:+.1%} CPU (pairs from {t['spread']['min']:+.1%} to "
                      f"{t['spread']['max']:+.1%}), {t['trace_overhead_wall']:+.1%} wall, without the scan "
                      f"{t['step_only']:+.1%} CPU, load {t['load_average_1m']:.1f}", flush=True)
            whole[p] = {**trace_overhead(p, pairs), "load_average_1m": os.getloadavg()[0]}
            print(f"{p:9} train_step(trace=) on a whole state, serial kernels: "
                  f"{whole[p]['trace_overhead_vs_replay']:+.1%} CPU, {whole[p]['trace_overhead_wall']:+.1%} wall "
                  f"(the steps alone: {whole[p]['step_only']:+.1%} CPU)", flush=True)
        out.update({"trace": traces, "trace_whole_state": whole,
                    "trace_machine": {**machine, "load_average_1m": os.getloadavg()[0]},
                    "trace_overhead_vs_replay": {p: t["default"]["trace_overhead_vs_replay"] for p, t in traces.items()}})
    out.pop("not_measured", None)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
