"""Parties of a dispute over one tiny step: an honest replayer, and a forger whose backend
perturbs one op's output (its trace commits the forged output, as a lying trainer's or auditor's
would). Each party's op data comes from a second traced run of the step that keeps that op."""

from __future__ import annotations

from open1b.deterministic import PRESETS, batch_for_step, builtin_dataset, init_state, train_step
from open1b.deterministic.backend import cpu_backend
from open1b.deterministic.op_trace import OpTrace
from open1b.node.disputes import Party
from open1b.node.op_data import OpData
from open1b.protocol import TensorBytes, state_hash, tensor_proof
from open1b.protocol.dispute.proof import InputBytes
from open1b.protocol.dispute.trace import TraceCommitment
from open1b.protocol.hashing import blake2b256
from open1b.protocol.identity import Identity

PRESET = PRESETS["tiny"]
RUN, STEP, PREV, BATCH_DIGEST, LR_BITS = blake2b256(b"run"), 1, blake2b256(b"prev"), blake2b256(b"batch"), 7


def step_inputs():
    config, topology = PRESET.config, PRESET.topology
    state = init_state(config, 0)
    return state, batch_for_step(builtin_dataset(config), 0, 0, config, topology)


def _tensors(state) -> dict[str, TensorBytes]:
    return {name: TensorBytes("float32", a.shape, a.tobytes()) for name, a in state.tensors().items()}


def pre_state(state) -> bytes:
    return state_hash(PREV, STEP, _tensors(state), BATCH_DIGEST, lr_bits=LR_BITS)


def party(identity: Identity, backend_factory=lambda: cpu_backend(False)) -> Party:
    """``identity``'s party: the step traced on the backend ``backend_factory`` makes (a fresh
    one per run, so a forger forges the same op every time), signed."""
    state, batch = step_inputs()
    topology = PRESET.topology
    trace = OpTrace()
    new_state, _ = train_step(state, batch, topology, backend=backend_factory(), trace=trace)
    tree = trace.tree()
    post = state_hash(blake2b256(b"h_k"), STEP + 1, _tensors(new_state), BATCH_DIGEST, lr_bits=LR_BITS)
    commitment = TraceCommitment.create(identity, run=RUN, step=STEP, pre_state=pre_state(state), post_state=post,
                                        ops=trace.ops, root=tree.root)
    tensors = _tensors(state)

    async def op_data(pos: int):
        kept = OpTrace(keep=frozenset({pos}))
        train_step(state, batch, topology, backend=backend_factory(), trace=kept)
        inputs, outputs = kept.kept[pos]
        entries = kept.records[pos]["inputs"]
        given = [InputBytes(a.tobytes(), tensor_proof(PREV, STEP, tensors, BATCH_DIGEST, e["state"], lr_bits=LR_BITS)
                            if "state" in e else None) for a, e in zip(inputs, entries)]
        return OpData(given, [a.tobytes() for a in outputs])

    return Party(commitment, tree, trace.records, op_data)
