"""Step fingerprints and spot checks (docs/run-format.md §10): cheap, exact checks of one step.

A trainer commits, for every step k, a :class:`StepFingerprint`: the float32 loss of every
(rank, micro-batch), in the engine's order (rank-major), the chunk Merkle root of the summed,
pre-clip gradient, and the step's loss, gradient norm and clipping coefficient. All of it comes
out of the one :func:`.step.train_step` path (:func:`fingerprinted_step` is its body with an
observer), so recording it changes no bit. Recording hashes one gradient a step (the sum), not
one per micro-batch: the micro-batch gradients are never committed, because the verifier's
recomputed slot stays secret until the trainer has answered (below).

A gradient is read in :meth:`.config.GPTConfig.param_shapes` order as one float32 vector and
cut into chunks of :data:`CHUNK_ELEMENTS` (the last one shorter); each chunk's little-endian
bytes are a leaf of a :class:`~open1b.protocol.merkle.MerkleTree`, so one chunk is proven
against a root with an audit path. The summed gradient's chunks are hashed straight from views of
the per-parameter arrays (a chunk may span several), never building the flat vector, on a small
thread pool while the update runs: hashlib releases the GIL, the engine's kernels too
(:data:`.jit.CPU_OPTIONS`).

A spot check links each piece of a step to the next, exactly. The verifier holds a slot s, secret
until the trainer has answered, and challenged chunks the trainer knows:

1. :func:`recompute_slot`: slot s recomputed from checkpoint k and the committed batch gives the
   committed loss bits (substituted data), and its gradient's challenged chunks, kept for link 4;
2. :func:`check_loss_sum`: the committed losses summed in the step's order give the step's loss;
3. :func:`check_chunks`, for each challenged chunk of the trainer's answer: the summed chunk opens
   the committed sum root, and AdamW applied to it and to that chunk of checkpoint k gives the same
   chunk of checkpoint k+1 (a skipped or altered update);
4. then slot s's answered chunk is the verifier's recomputation (a forged micro-batch), and every
   slot's chunks sum in the step's order to the summed chunk (a sum that is not the sum of the
   micro-batches). The trainer does not know s, so a forged micro-batch it hides in its answer is
   in slot s with probability 1 / (ranks × micro_batches).

The trainer answers a challenge with :func:`answer_challenge`, which recomputes the step's gradients
once (not the update) and hashes one gradient, the sum.
"""

from __future__ import annotations

import bisect
import enum
import itertools
import math
import os
from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from open1b.protocol.codec import encode
from open1b.protocol.hashing import blake2b256
from open1b.protocol.merkle import MerkleTree, leaf_hash, verify_merkle_proof

from .backend import default_backend
from .process_pool import PerProcessPool
from .config import GPTConfig, Topology
from .gpt import forward_backward
from .reduction import RANK_GROUP
from .state import TrainState
from .step import StepReport, _GroupedTree, _inv_tokens, adamw_scalars, check_batch, finish_step, step_gradients

CHUNK_ELEMENTS = 1 << 14
"""float32 elements per gradient chunk (64 KiB): a constant of the run format, like a tile size."""

_F32 = np.dtype("<f4")
_CHUNK_BYTES = CHUNK_ELEMENTS * _F32.itemsize
HASH_THREADS = max(1, min(4, os.cpu_count() or 1))
"""Threads hashing gradient chunks (speed only): the summed gradient's leaves are split among them."""


def chunk_count(config: GPTConfig) -> int:
    return math.ceil(config.n_params() / CHUNK_ELEMENTS)


def f32_bits(x: Any) -> int:
    return int(np.asarray(x, _F32).reshape(-1)[0:1].view(np.uint32)[0])


def flat_gradient(grads: dict, config: GPTConfig, be) -> np.ndarray:
    """The gradient as one host float32 vector, parameters in the canonical order."""
    return np.concatenate([np.asarray(be.download(grads[name]), _F32).reshape(-1) for name in config.param_shapes()])


def chunk_tree(flat: np.ndarray) -> MerkleTree:
    """The Merkle tree whose leaves are the bytes of ``flat``'s :data:`CHUNK_ELEMENTS`-element chunks."""
    return MerkleTree([flat[i:i + CHUNK_ELEMENTS].tobytes() for i in range(0, flat.shape[0], CHUNK_ELEMENTS)])


def chunk(flat: np.ndarray, index: int) -> np.ndarray:
    return flat[index * CHUNK_ELEMENTS:(index + 1) * CHUNK_ELEMENTS]


class _Gradient:
    """A gradient read as §10.1's flat vector without concatenating it: the f32le bytes of each
    parameter's host array in the canonical order, and chunk ``c``'s bytes as views of the one or
    more arrays it spans."""

    def __init__(self, grads: dict, config: GPTConfig, be) -> None:
        self.parts = [memoryview(np.ascontiguousarray(be.download(grads[name]), _F32).reshape(-1)).cast("B")
                      for name in config.param_shapes()]  # fmt: skip
        self.starts = list(itertools.accumulate((p.nbytes for p in self.parts), initial=0))
        self.leaves = -(-self.starts[-1] // _CHUNK_BYTES)

    def pieces(self, index: int) -> list[memoryview]:
        lo, hi = index * _CHUNK_BYTES, min((index + 1) * _CHUNK_BYTES, self.starts[-1])
        out, t = [], bisect.bisect_right(self.starts, lo) - 1
        while lo < hi:
            end = min(hi, self.starts[t + 1])
            out.append(self.parts[t][lo - self.starts[t]:end - self.starts[t]])
            lo, t = end, t + 1
        return out

    def chunk(self, index: int) -> np.ndarray:
        """A copy of chunk ``index`` (what :func:`chunk` gives of the flat vector)."""
        return np.frombuffer(b"".join(self.pieces(index)), _F32)

    def leaf_hashes(self, lo: int, hi: int) -> list[bytes]:
        return [leaf_hash(*self.pieces(i)) for i in range(lo, hi)]

    def hash_async(self) -> Callable[[], MerkleTree]:
        """Start hashing the leaves on :data:`HASH_THREADS` threads; the returned function waits
        for them and gives the chunk tree (its inner nodes are a few hundred small hashes)."""
        cuts = [self.leaves * i // HASH_THREADS for i in range(HASH_THREADS + 1)]
        parts = [_pool().submit(self.leaf_hashes, lo, hi) for lo, hi in zip(cuts, cuts[1:]) if lo < hi]
        return lambda: MerkleTree.of_leaf_hashes([h for p in parts for h in p.result()])


def gradient_tree(grads: dict, config: GPTConfig, be) -> MerkleTree:
    """:func:`chunk_tree` of :func:`flat_gradient` (the same root), hashed from views in parallel."""
    return _Gradient(grads, config, be).hash_async()()


_pool = PerProcessPool(HASH_THREADS, "open1b-fingerprint")


@dataclass(frozen=True)
class StepFingerprint:
    """What a trainer commits for step ``step`` (module doc). ``losses`` is indexed by
    ``rank * micro_batches + micro_batch``; losses and scalars are float32 bits."""

    step: int
    losses: tuple[int, ...]
    sum_root: bytes
    loss: int
    grad_norm: int
    clip_coef: int

    def value(self) -> dict:
        """The canonical CBOR map of the run's fingerprints file (docs/run-format.md §10)."""
        return {"step": self.step, "losses": list(self.losses), "sum_root": self.sum_root, "loss": self.loss, "grad_norm": self.grad_norm,
                "clip_coef": self.clip_coef}  # fmt: skip

    @property
    def commitment(self) -> bytes:
        """F_k: BLAKE2b-256 of the canonical CBOR of :meth:`value`."""
        return blake2b256(encode(self.value()))


class _Recorder:
    """The observer of one step: every micro-batch's loss bits and, for the chunks in ``keep``
    (an answer's), copies of those chunks of its gradient. Nothing is hashed per micro-batch."""

    def __init__(self, config: GPTConfig, topology: Topology, be, keep: tuple[int, ...] = ()) -> None:
        self.config, self.be, self.keep, self.per_rank = config, be, keep, topology.micro_batches
        self.losses: dict[int, int] = {}
        self.kept: dict[int, dict[int, np.ndarray]] = {}

    def __call__(self, rank: int, micro: int, loss, grads: dict) -> None:
        slot = rank * self.per_rank + micro
        self.losses[slot] = f32_bits(self.be.download(loss))
        if self.keep:
            gradient = _Gradient(grads, self.config, self.be)
            self.kept[slot] = {c: gradient.chunk(c) for c in self.keep}


def fingerprinted_step(state: TrainState, batch: np.ndarray, topology: Topology, *, backend=None
                       ) -> tuple[TrainState, StepReport, StepFingerprint]:
    """:func:`.step.train_step` (same pieces, same bits) and the step's :class:`StepFingerprint`."""
    config = state.config
    be = backend or default_backend(config)
    loss, grads, recorder, summed = _recorded_gradients(state, batch, topology, be, ())
    summed_tree = summed.hash_async()  # hashed while the update runs, which never writes the gradients
    new_state, report = finish_step(state, loss, grads, be)
    slots = range(topology.ranks * topology.micro_batches)
    fingerprint = StepFingerprint(state.step, tuple(recorder.losses[s] for s in slots), summed_tree().root,
                                  f32_bits(report.loss), f32_bits(report.grad_norm), f32_bits(report.clip_coef))
    return new_state, report, fingerprint


def _recorded_gradients(state: TrainState, batch: np.ndarray, topology: Topology, be, keep: tuple[int, ...]):
    """:func:`.step.step_gradients` observed by a :class:`_Recorder`: (loss, summed gradients,
    recorder, the summed gradient as a :class:`_Gradient`)."""
    check_batch(batch, state.config, topology)
    recorder = _Recorder(state.config, topology, be, keep)
    loss, grads = step_gradients(state, batch, topology, be, recorder)
    return loss, grads, recorder, _Gradient(grads, state.config, be)


@dataclass(frozen=True)
class ChunkOpening:
    """Chunk ``index`` of every micro-batch's gradient (slot order), and of the summed gradient
    with its audit path against the fingerprint's ``sum_root``."""

    index: int
    micro: tuple[np.ndarray, ...]
    summed: np.ndarray
    summed_proof: tuple[bytes, ...]


def answer_challenge(state: TrainState, batch: np.ndarray, topology: Topology, chunks: tuple[int, ...], *,
                     backend=None) -> tuple[ChunkOpening, ...]:
    """The trainer's answer to a challenge of ``chunks`` of step ``state.step``: the step's
    gradients recomputed once (not its update, which the answer does not need), keeping only the
    challenged chunks, and the summed gradient hashed for their proofs."""
    be = backend or default_backend(state.config)
    *_, recorder, summed = _recorded_gradients(state, batch, topology, be, tuple(chunks))
    tree = summed.hash_async()()
    slots = range(topology.ranks * topology.micro_batches)
    return tuple(ChunkOpening(c, tuple(recorder.kept[s][c] for s in slots), summed.chunk(c), tuple(tree.proof(c)))
                 for c in chunks)


class Caught(str, enum.Enum):
    """Which link of a step a spot check found broken (docs/run-format.md §10.3); NONE: all held."""

    NONE = "none"
    LOSS = "loss"  # the recomputed slot's loss differs from the committed one
    GRADIENT = "gradient"  # the answered chunks of the secret slot differ from its recomputation
    LOSS_SUM = "loss_sum"  # the committed losses do not sum to the step's loss
    PROOF = "proof"  # an answered summed chunk does not open the sum root (or the answer is malformed)
    SUM = "sum"  # the micro-batch chunks do not sum to the committed summed chunk
    UPDATE = "update"  # AdamW on the summed chunk does not give checkpoint k+1's chunk
    NO_ANSWER = "no_answer"  # the trainer did not answer in the stated time


def recompute_slot(fp: StepFingerprint, state: TrainState, batch: np.ndarray, topology: Topology, slot: int,
                   chunks: tuple[int, ...], *, backend=None) -> tuple[Caught, tuple[np.ndarray, ...]]:
    """Link 1: recompute ``slot`` (rank · micro_batches + micro-batch) of the step from ``state``
    (checkpoint k) and its committed ``batch``; compare its loss bits with ``fp``. Gives the verdict
    and the gradient's ``chunks``, which :func:`check_chunks` compares with the trainer's answer.
    About 1/(ranks × micro_batches) of a replay."""
    config = state.config
    check_batch(batch, config, topology)
    be = backend or default_backend(config)
    params, _, _ = be.load_state(state)
    rank, micro = divmod(slot, topology.micro_batches)
    mb = be.micro_batches(batch[rank:rank + 1, micro:micro + 1], config.vocab_size)[0][0]
    loss, grads = forward_backward(params, mb, _inv_tokens(config, topology), config, be)
    gradient = _Gradient(grads, config, be)
    mine = tuple(gradient.chunk(c) for c in chunks)
    return (Caught.LOSS if f32_bits(be.download(loss)) != fp.losses[slot] else Caught.NONE), mine


def check_loss_sum(fp: StepFingerprint, config: GPTConfig, topology: Topology, *, backend=None) -> Caught:
    """Link 2: the committed per-micro-batch losses, summed in the step's order, give its loss."""
    be = backend or default_backend(config)
    total = _reduce([[{"x": np.array([fp.losses[r * topology.micro_batches + m]], np.uint32).view(_F32)}
                      for m in range(topology.micro_batches)] for r in range(topology.ranks)], be.add, be.plus_zero)
    return Caught.NONE if f32_bits(total["x"]) == fp.loss else Caught.LOSS_SUM


def check_chunks(fp: StepFingerprint, openings: tuple[ChunkOpening, ...], slot: int, mine: tuple[np.ndarray, ...],
                 before: TrainState, after: TrainState, topology: Topology, *, backend=None) -> Caught:
    """Links 3 and 4 for every opened chunk: the summed chunk's proof and AdamW from checkpoint k
    (``before``) to checkpoint k+1 (``after``) on it, which bind the trainer's commitments whoever
    answered; then the secret ``slot``'s chunks against the verifier's recomputation ``mine`` (in
    ``openings``' order) and the sum in the step's order, which bind only the answerer."""
    config = before.config
    be = backend or default_backend(config)
    n, slots, leaves = config.n_params(), topology.ranks * topology.micro_batches, chunk_count(config)
    for op in openings:
        length = min(CHUNK_ELEMENTS, n - op.index * CHUNK_ELEMENTS) if 0 <= op.index < leaves else -1
        # the answer's shape first: nothing is computed on arrays of a length the run does not give
        if length < 1 or len(op.micro) != slots or any(
                not isinstance(a, np.ndarray) or a.dtype != _F32 or a.shape != (length,) for a in (op.summed, *op.micro)):
            return Caught.PROOF
        if not verify_merkle_proof(op.summed.tobytes(), op.index, leaves, op.summed_proof, fp.sum_root):
            return Caught.PROOF
        if not _update_holds(op, before, after, np.array([fp.clip_coef], np.uint32).view(_F32)[0], be):
            return Caught.UPDATE
    if len(mine) != len(openings) or any(op.micro[slot].tobytes() != np.asarray(m, _F32).tobytes()
                                         for op, m in zip(openings, mine)):
        return Caught.GRADIENT
    for op in openings:
        per_rank = [[{"x": op.micro[r * topology.micro_batches + m]} for m in range(topology.micro_batches)]
                    for r in range(topology.ranks)]
        if _reduce(per_rank, be.add, be.plus_zero)["x"].tobytes() != op.summed.tobytes():
            return Caught.SUM
    return Caught.NONE


def _reduce(per_rank: list[list[dict]], add, plus_zero) -> dict:
    """:mod:`.step`'s order on terms: micro-batches folded from +0.0 per rank, ranks by the grouped tree."""
    ranks = _GroupedTree(RANK_GROUP, add, plus_zero)
    for micros in per_rank:
        fold = _GroupedTree(len(micros), add, plus_zero)
        for term in micros:
            fold.push(term)
        ranks.push(fold.total())
    return ranks.total()


def _update_holds(op: ChunkOpening, before: TrainState, after: TrainState, coef: np.float32, be) -> bool:
    """AdamW of every parameter's part of chunk ``op.index`` gives ``after``'s params, m and v there."""
    scalars, _, _ = adamw_scalars(before)
    lo, hi, offset = op.index * CHUNK_ELEMENTS, op.index * CHUNK_ELEMENTS + op.summed.shape[0], 0
    for name, shape in before.config.param_shapes().items():
        size = math.prod(shape)
        a, b = max(lo, offset), min(hi, offset + size)
        if a < b:
            part = slice(a - offset, b - offset)
            old = [np.ascontiguousarray(t[name].reshape(-1)[part]) for t in (before.params, before.m, before.v)]
            new = be.adamw(old[0], np.ascontiguousarray(op.summed[a - lo:b - lo]), old[1], old[2],
                           replace(scalars[name], coef=coef))
            want = (after.params[name], after.m[name], after.v[name])
            if any(np.asarray(x).tobytes() != w.reshape(-1)[part].tobytes() for x, w in zip(new, want)):
                return False
        offset += size
    return True
