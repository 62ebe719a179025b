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

from open1b.protocol import RunManifest, tensor_proof
from open1b.protocol.codec import encode
from open1b.protocol.dispute.proof import InputBytes
from open1b.protocol.dispute.trace import chunk_tree
from open1b.protocol.merkle import MerkleTree

from .data import batch_for_step
from .errors import CheckpointMismatchError
from .op_trace import OpTrace
from .provenance import checked_run_samples
from .replay import check_data_rules
from .runfile import genesis_hash, load_checkpoint, read_manifest, lr_bits, next_state_hash, state_tensor_bytes, step_batch_digest
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


class _Step:
    """Checkpoint k, its batch, and h_k's preimage (for tensor proofs), checked against h_k."""

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
        if next_state_hash(self.prev, self.state, prev_batch) != manifest.state_hashes[step]:
            raise CheckpointMismatchError(f"checkpoint {step} does not hash to the published h_{step}")
        self.consumed = step_batch_digest(prev_batch) if prev_batch is not None else bytes(32)
        self.lr_bits = lr_bits(self.config) if prev_batch is not None else 0
        self.batch = batch_for_step(dataset, manifest.seed, step, self.config, self.topology)
        self.tensors = state_tensor_bytes(self.state)

    def run(self, trace: OpTrace, backend):
        return train_step(self.state, self.batch, self.topology, backend=backend, trace=trace, witness_rule=self.rule)


def trace_step(run_dir: Path, manifest: RunManifest, step: int, *, backend=None) -> TracedStep:
    """Replay step ``step`` with its op trace; the state inputs' roots come from checkpoint k's
    tensors (the check against h_k hashed the same chunks)."""
    s = _Step(Path(run_dir), manifest, step)
    roots = {name: chunk_tree(t.data, state=True).root for name, t in s.tensors.items()}
    trace = OpTrace(state_roots=roots)
    new_state, _ = s.run(trace, backend)
    post = next_state_hash(manifest.state_hashes[step], new_state, s.batch)
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
