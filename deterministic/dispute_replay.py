"""A disputing party's replay (docs/protocol.md §18.5): step k of a run replayed from checkpoint k
with its op trace, and the data of one op of it, which a fraud proof carries; and the files the
node's worker writes of them (:func:`write_dispute_file`, read by node/dispute_tracer.py).

Both are the step traced (:class:`.op_trace.OpTrace`) on checkpoint k and the committed batch;
``backend`` is the party's (a test's or a forger's may differ from the default, which is how a
forged op is made). Checkpoint k must hash to the published h_k: a trace always starts from the
published state.

As a replay (:mod:`.replay`), the party never holds the checkpoint whole: it is read once in
pieces (:func:`.replay.scan_published`), whose chunk digests give the state tensors' roots and
tensor proofs; the parameters are kept, each moment is read back (chunk-checked) when its update
runs, and the new state is hashed a tensor at a time (:func:`.step.train_step_streamed`, the same
ops in the same order, so the same trace), the update's outputs from the chunk digests the trace
hashed them by (§18.1, r20: each state chunk is hashed once). The gradient sum is not parked on disk here: a traced
op's inputs are found by identity, and an array read back from a spill file is a new one.
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from open1b.protocol import RunManifest, TensorProof
from open1b.protocol.codec import encode
from open1b.protocol.commitments import state_root_of_digests, tensor_digest_of_chunks, tensor_proof_of_digests
from open1b.protocol.dispute.proof import InputBytes
from open1b.protocol.merkle import MerkleTree

from .backend import default_backend
from .checkpoint_stream import StateSink, add_params_and_powers, chunk_digests, scanned_state
from .data import batch_for_step
from .op_trace import OpTrace, TracingBackend
from .provenance import checked_run_samples
from .replay import before_step, check_data_rules, scan_published
from .runfile import hash_of_link, link_of_root, lr_bits, read_manifest, state_tensor_bytes, step_batch_digest
from .state import TrainState
from .step import train_step_streamed
from .trainer import config_of


@dataclass(frozen=True)
class TracedStep:
    """A party's trace of step ``step``: its records (``trace``), tree, and the h_{k+1} it reached."""

    step: int
    trace: OpTrace
    tree: MerkleTree
    pre_state: bytes
    post_state: bytes


def state_hash_of_chunks(prev: bytes, state: TrainState, batch: np.ndarray | None,
                         chunks: Mapping[str, list[bytes]]) -> bytes:
    """:func:`.runfile.next_state_hash` of ``state`` where ``chunks`` gives some tensors' state-tree
    chunk digests, hashed already (the update's outputs by the trace, §18.1); the others are
    hashed here, on every core."""
    arrays, digests = state.tensors(), {}
    for name, t in state_tensor_bytes(state).items():
        own = chunks.get(name)
        digests[name] = tensor_digest_of_chunks(name, t.dtype, t.shape,
                                                own if own is not None else chunk_digests(arrays[name]))
    return hash_of_link(prev, link_of_root(state.config, state.step, batch, state_root_of_digests(digests)))


class _TracedSink:
    """The new state, a tensor at a time (:class:`.checkpoint_stream.StateSink`), taking the
    update's outputs' chunk digests from the trace, which hashed them by the state tree's chunks."""

    def __init__(self, sink: StateSink, trace: OpTrace) -> None:
        self._sink, self._trace = sink, trace

    def add(self, name: str, array: np.ndarray) -> None:
        self._sink.add(name, array, digests=self._trace.post_chunks.get(name))

    def root(self):
        return self._sink.root()


class DisputeStep:
    """Checkpoint k (scanned, checked against h_k), its batch, and h_k's preimage (for tensor
    proofs); :meth:`run` once (bench/dispute_bench.py puts the scan's parameters back to run it again)."""

    def __init__(self, run_dir: Path, manifest: RunManifest, step: int) -> None:
        self.config, self.topology = config_of(manifest)
        self.rule = check_data_rules(manifest)
        self.step, self.h_k = step, manifest.state_hashes[step]
        dataset = checked_run_samples(run_dir, manifest)
        self.prev, prev_batch = before_step(manifest, dataset, step, self.config, self.topology)
        self.scan = scan_published(run_dir, manifest, step, self.config, self.prev, prev_batch)
        self.consumed = step_batch_digest(prev_batch) if prev_batch is not None else bytes(32)
        self.lr_bits = lr_bits(self.config) if prev_batch is not None else 0
        self.batch = batch_for_step(dataset, manifest.seed, step, self.config, self.topology)
        # each state tensor's digest and chunk-tree root, from the scan's chunk digests (what
        # hashing its bytes gives)
        self.digests = {name: tensor_digest_of_chunks(name, "float32", slot.shape, self.scan.digests[name])
                        for name, slot in self.scan.slots.items()}  # fmt: skip
        self.roots = {name: MerkleTree(chunks).root for name, chunks in self.scan.digests.items()}

    def run(self, trace: OpTrace | None, backend) -> bytes:
        """The step traced into ``trace``: the h_{k+1} it reaches. ``trace`` None: the same
        streamed replay untraced, what a trace's overhead is measured against."""
        be = backend or default_backend(self.config)
        sink = StateSink(self.config)
        if trace is not None:
            be, sink = TracingBackend(be, trace), _TracedSink(sink, trace)
        params, _, beta1_pow, beta2_pow = train_step_streamed(scanned_state(self.scan, self.config, self.step),
                                                              self.batch, self.topology, sink.add, backend=be,
                                                              witness_rule=self.rule)  # fmt: skip
        add_params_and_powers(sink, params, beta1_pow, beta2_pow)
        return hash_of_link(self.h_k, link_of_root(self.config, self.step + 1, self.batch, sink.root()))


def trace_step(run_dir: Path, manifest: RunManifest, step: int, *, backend=None) -> TracedStep:
    """Replay step ``step`` with its op trace; the state inputs' roots come from checkpoint k's
    chunk digests (the check against h_k hashed the same chunks), and h_{k+1} takes the update's
    outputs' chunk digests from the trace (each state chunk is hashed once)."""
    s = DisputeStep(Path(run_dir), manifest, step)
    trace = OpTrace(state_roots=s.roots)
    post = s.run(trace, backend)
    return TracedStep(step, trace, trace.tree(), manifest.state_hashes[step], post)


def _kept_op(run_dir: Path, manifest: RunManifest, step: int, pos: int, backend
             ) -> tuple[list[tuple[np.ndarray, TensorProof | None]], list[np.ndarray]]:
    s = DisputeStep(Path(run_dir), manifest, step)
    trace = OpTrace(state_roots=s.roots, keep=frozenset({pos}))
    s.run(trace, backend)
    inputs, outputs = trace.kept[pos]
    given = [(a, tensor_proof_of_digests(s.prev, step, s.digests, s.consumed, e["state"], lr_bits=s.lr_bits)
              if "state" in e else None) for a, e in zip(inputs, trace.records[pos]["inputs"])]  # fmt: skip
    return given, outputs


def op_data(run_dir: Path, manifest: RunManifest, step: int, pos: int, *, backend=None
            ) -> tuple[list[InputBytes], list[bytes]]:
    """Op ``pos`` of step ``step`` as this party computes it: its inputs' bytes (a state input with
    its tensor proof against h_k) and its outputs' bytes."""
    inputs, outputs = _kept_op(run_dir, manifest, step, pos, backend)
    return [InputBytes(a.tobytes(), proof) for a, proof in inputs], [a.tobytes() for a in outputs]


OP_FILE_HEAD = struct.Struct("<I")
"""An op-data file starts with its header's length (node/op_data.py reads it)."""


def write_dispute_file(run_dir: Path, step: int, out: Path, pos: int | None = None) -> int:
    """The worker's answer to a dispute's request in ``out`` (its size): the trace of ``step``
    (``pos`` None), canonical CBOR ``{"records", "pre_state", "post_state"}``; or op ``pos``'s
    data, which the daemon reads in pieces (node/op_data.py): u32le n, an n-byte canonical CBOR
    header ``{"inputs": [[nbytes, tensor proof | null]…], "outputs": [nbytes…]}``, then each
    input's raw bytes and each output's, in that order, written from the arrays (no copy whole)."""
    manifest = read_manifest(Path(run_dir))
    if pos is None:
        t = trace_step(run_dir, manifest, step)
        data = encode({"records": t.trace.records, "pre_state": t.pre_state, "post_state": t.post_state})
        Path(out).write_bytes(data)
        return len(data)
    inputs, outputs = _kept_op(run_dir, manifest, step, pos, None)
    arrays = [np.ascontiguousarray(a) for a, _ in inputs] + [np.ascontiguousarray(a) for a in outputs]
    header = encode({"inputs": [[a.nbytes, None if proof is None else dataclasses.asdict(proof)]
                                for (a, proof) in inputs], "outputs": [a.nbytes for a in outputs]})
    with open(out, "wb") as f:
        f.write(OP_FILE_HEAD.pack(len(header)) + header)
        for a in arrays:
            f.write(memoryview(a).cast("B"))
    return OP_FILE_HEAD.size + len(header) + sum(a.nbytes for a in arrays)
