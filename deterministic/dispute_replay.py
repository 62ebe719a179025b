"""A disputing party's replay (docs/protocol.md §18.5): step k of a run replayed from checkpoint k
with its op trace, and the data of one op of it, which a fraud proof carries; and the files the
node's worker writes of them (:func:`write_dispute_file`, read by node/dispute_tracer.py).

Both are :func:`.step.train_step` on checkpoint k and the committed batch, traced
(:class:`.op_trace.OpTrace`); ``backend`` is the party's (a test's or a forger's may differ from
the default, which is how a forged op is made). Checkpoint k must hash to the published h_k: a
trace always starts from the published state.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from typing import Mapping

import numpy as np

from open1b.protocol import RunManifest, tensor_proof
from open1b.protocol.codec import encode
from open1b.protocol.commitments import state_root_of_digests, tensor_digest_of_chunks
from open1b.protocol.dispute.proof import InputBytes
from open1b.protocol.merkle import MerkleTree, merkle_root

from .checkpoint_stream import chunk_digests
from .data import batch_for_step
from .errors import CheckpointMismatchError
from .op_trace import OpTrace
from .provenance import checked_run_samples
from .replay import check_data_rules
from .runfile import (
    genesis_hash, hash_of_link, link_of_root, load_checkpoint, lr_bits, read_manifest, state_tensor_bytes,
    step_batch_digest,
)  # fmt: skip
from .state import TrainState
from .step import train_step
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


class _Step:
    """Checkpoint k, its batch, and h_k's preimage (for tensor proofs), checked against h_k; the
    state tree's root of each tensor (``roots``), from the chunks that check hashed."""

    def __init__(self, run_dir: Path, manifest: RunManifest, step: int) -> None:
        self.config, self.topology = config_of(manifest)
        self.rule = check_data_rules(manifest)
        dataset = checked_run_samples(run_dir, manifest)
        self.state = load_checkpoint(run_dir, step, self.config, manifest.checkpoints[step])
        if step == 0:
            self.prev, prev_batch = genesis_hash(manifest.body()), None
        else:
            self.prev = manifest.state_hashes[step - 1]
            prev_batch = batch_for_step(dataset, manifest.seed, step - 1, self.config, self.topology)
        chunks = {name: chunk_digests(a) for name, a in self.state.tensors().items()}
        if state_hash_of_chunks(self.prev, self.state, prev_batch, chunks) != manifest.state_hashes[step]:
            raise CheckpointMismatchError(f"checkpoint {step} does not hash to the published h_{step}")
        self.roots = {name: merkle_root(c) for name, c in chunks.items()}
        self.consumed = step_batch_digest(prev_batch) if prev_batch is not None else bytes(32)
        self.lr_bits = lr_bits(self.config) if prev_batch is not None else 0
        self.batch = batch_for_step(dataset, manifest.seed, step, self.config, self.topology)
        self.tensors = state_tensor_bytes(self.state)

    def run(self, trace: OpTrace, backend):
        return train_step(self.state, self.batch, self.topology, backend=backend, trace=trace, witness_rule=self.rule)


def trace_step(run_dir: Path, manifest: RunManifest, step: int, *, backend=None) -> TracedStep:
    """Replay step ``step`` with its op trace; the state inputs' roots are those the check of
    checkpoint k against h_k computed, and h_{k+1} takes the update's outputs' chunk digests from
    the trace (each state chunk is hashed once)."""
    s = _Step(Path(run_dir), manifest, step)
    trace = OpTrace(state_roots=s.roots)
    new_state, _ = s.run(trace, backend)
    post = state_hash_of_chunks(manifest.state_hashes[step], new_state, s.batch, trace.post_chunks)
    return TracedStep(step, trace, trace.tree(), manifest.state_hashes[step], post)


def op_data(run_dir: Path, manifest: RunManifest, step: int, pos: int, *, backend=None
            ) -> tuple[list[InputBytes], list[bytes]]:
    """Op ``pos`` of step ``step`` as this party computes it: its inputs' bytes (a state input with
    its tensor proof against h_k) and its outputs' bytes."""
    s = _Step(Path(run_dir), manifest, step)
    trace = OpTrace(keep=frozenset({pos}))
    s.run(trace, backend)
    inputs, outputs = trace.kept[pos]
    given = [InputBytes(a.tobytes(), tensor_proof(s.prev, step, s.tensors, s.consumed, e["state"], lr_bits=s.lr_bits)
                        if "state" in e else None) for a, e in zip(inputs, trace.records[pos]["inputs"])]
    return given, [a.tobytes() for a in outputs]


def write_dispute_file(run_dir: Path, step: int, out: Path, pos: int | None = None) -> int:
    """The worker's answer to a dispute's request, as canonical CBOR in ``out`` (its size): the
    trace of ``step`` (``pos`` None: ``{"records", "pre_state", "post_state"}``), or op ``pos``'s
    data (``{"inputs": [[bytes, tensor proof | null]…], "outputs": [bytes…]}``)."""
    manifest = read_manifest(Path(run_dir))
    if pos is None:
        t = trace_step(run_dir, manifest, step)
        body = {"records": t.trace.records, "pre_state": t.pre_state, "post_state": t.post_state}
    else:
        inputs, outputs = op_data(run_dir, manifest, step, pos)
        body = {"inputs": [[i.data, None if i.state_proof is None else dataclasses.asdict(i.state_proof)]
                           for i in inputs], "outputs": outputs}
    data = encode(body)
    Path(out).write_bytes(data)
    return len(data)
