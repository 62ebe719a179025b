"""Step fingerprints and spot checks (docs/run-format.md §10): cheap, exact checks of one step.

A trainer commits, for every step k, a :class:`StepFingerprint`: the float32 loss of every
(rank, micro-batch), in the engine's order (rank-major), and the step's loss, gradient norm and
clipping coefficient. All of it comes out of the one :func:`.step.train_step` path
(:func:`fingerprinted_step` is its body with an observer), so recording it changes no bit, and it
hashes nothing: no gradient is committed. The summed gradient is bound by checkpoint k+1 (which
h_{k+1} commits) through the update, and every micro-batch's by the verifier's secret slot.

A gradient is read in :meth:`.config.GPTConfig.param_shapes` order as one float32 vector and cut
into chunks of :data:`CHUNK_ELEMENTS` (the last one shorter); a chunk is copied straight from views
of the per-parameter arrays (it may span several), never building the flat vector.

A spot check links each piece of a step to the next, exactly. The verifier holds a slot s, secret
until the trainer has answered, and challenged chunks the trainer knows:

1. :func:`recompute_slot`: slot s recomputed from checkpoint k and the committed batch gives the
   committed loss bits (substituted data), and its gradient's challenged chunks, kept for link 4;
2. :func:`check_loss_sum`: the committed losses summed in the step's order give the step's loss;
3. :func:`check_chunks`, for each challenged chunk of the trainer's answer: AdamW applied to the
   answered summed chunk and to that chunk of checkpoint k, with the committed clipping
   coefficient, gives the same chunk of checkpoint k+1 (a skipped or altered update);
4. then slot s's answered chunk is the verifier's recomputation (a forged micro-batch), and every
   slot's chunks sum in the step's order to the summed chunk (a sum that is not the sum of the
   micro-batches). The trainer does not know s, so a difference it hides in its answer is in
   slot s with probability 1 / (ranks × micro_batches).

The trainer answers a challenge with :func:`answer_challenge`, which recomputes the step's
gradients once (not the update) and copies out the challenged chunks.
"""

from __future__ import annotations

import bisect
import enum
import itertools
import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from open1b.protocol.codec import encode
from open1b.protocol.hashing import blake2b256

from .backend import default_backend
from .checkpoint_stream import HeldChunks
from .config import GPTConfig, Topology
from .gpt import forward_backward
from .reduction import RANK_GROUP
from .state import TrainState
from .step import (
    StepReport, _GroupedTree, _inv_tokens, adamw_scalars, check_batch, finish_step, step_gradients, train_step_streamed,
)  # fmt: skip

if TYPE_CHECKING:  # a spot check's checkpoints held in part (spot_state imports this module's constants)
    from .spot_state import PartState

CHUNK_ELEMENTS = 1 << 14
"""float32 elements per gradient chunk (64 KiB): a constant of the run format, like a tile size."""

_F32 = np.dtype("<f4")
_CHUNK_BYTES = CHUNK_ELEMENTS * _F32.itemsize


def chunk_count(config: GPTConfig) -> int:
    return math.ceil(config.n_params() / CHUNK_ELEMENTS)


def chunk_length(config: GPTConfig, index: int) -> int:
    """Elements in chunk ``index`` of the run's gradient (< 1 for an index it does not have)."""
    return min(CHUNK_ELEMENTS, config.n_params() - index * CHUNK_ELEMENTS) if index >= 0 else -1


def f32_bits(x: Any) -> int:
    return int(np.asarray(x, _F32).reshape(-1)[0:1].view(np.uint32)[0])


def flat_gradient(grads: dict, config: GPTConfig, be) -> np.ndarray:
    """The gradient as one host float32 vector, parameters in the canonical order."""
    return np.concatenate([np.asarray(be.download(grads[name]), _F32).reshape(-1) for name in config.param_shapes()])


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

    def chunk(self, index: int) -> np.ndarray:
        """A copy of chunk ``index`` (what :func:`chunk` gives of the flat vector)."""
        lo, hi = index * _CHUNK_BYTES, min((index + 1) * _CHUNK_BYTES, self.starts[-1])
        out, t = [], bisect.bisect_right(self.starts, lo) - 1
        while lo < hi:
            end = min(hi, self.starts[t + 1])
            out.append(self.parts[t][lo - self.starts[t]:end - self.starts[t]])
            lo, t = end, t + 1
        return np.frombuffer(b"".join(out), _F32)


@dataclass(frozen=True)
class StepFingerprint:
    """What a trainer commits for step ``step`` (module doc). ``losses`` is indexed by
    ``rank * micro_batches + micro_batch``; losses and scalars are float32 bits."""

    step: int
    losses: tuple[int, ...]
    loss: int
    grad_norm: int
    clip_coef: int

    def value(self) -> dict:
        """The canonical CBOR map of the run's fingerprints file (docs/run-format.md §10)."""
        return {"step": self.step, "losses": list(self.losses), "loss": self.loss, "grad_norm": self.grad_norm,
                "clip_coef": self.clip_coef}  # fmt: skip

    @property
    def commitment(self) -> bytes:
        """F_k: BLAKE2b-256 of the canonical CBOR of :meth:`value`."""
        return blake2b256(encode(self.value()))


class _Recorder:
    """The observer of one step: every micro-batch's loss bits and, for the chunks in ``keep``
    (an answer's), copies of those chunks of its gradient."""

    def __init__(self, config: GPTConfig, topology: Topology, be, keep: tuple[int, ...] = ()) -> None:
        self.config, self.be, self.keep, self.per_rank = config, be, keep, topology.micro_batches
        self.losses: dict[int, int] = {}
        self.kept: dict[int, dict[int, np.ndarray]] = {}

    def __call__(self, rank: int, micro: int, loss, grads: dict) -> None:
        self.loss(rank, micro, loss)
        if self.keep:
            gradient = _Gradient(grads, self.config, self.be)
            self.kept[rank * self.per_rank + micro] = {c: gradient.chunk(c) for c in self.keep}

    def loss(self, rank: int, micro: int, loss) -> None:
        """A micro-batch's loss alone (:data:`.step.LossObserver`): all a fingerprint records."""
        self.losses[rank * self.per_rank + micro] = f32_bits(self.be.download(loss))

    def slot_losses(self) -> tuple[int, ...]:
        return tuple(self.losses[s] for s in range(len(self.losses)))


def fingerprinted_step(state: TrainState, batch: np.ndarray, topology: Topology, *, backend=None
                       ) -> tuple[TrainState, StepReport, StepFingerprint]:
    """:func:`.step.train_step` (same pieces, same bits) and the step's :class:`StepFingerprint`."""
    be = backend or default_backend(state.config)
    loss, grads, recorder = _recorded_gradients(state, batch, topology, be, ())
    new_state, report = finish_step(state, loss, grads, be)
    fingerprint = StepFingerprint(state.step, recorder.slot_losses(), f32_bits(report.loss),
                                  f32_bits(report.grad_norm), f32_bits(report.clip_coef))
    return new_state, report, fingerprint


def fingerprinted_step_streamed(state: TrainState, batch: np.ndarray, topology: Topology, sink, *, backend=None,
                                reread: Mapping[str, np.ndarray] | None = None, spill_dir=None
                                ) -> tuple[dict, StepReport, np.float32, np.float32, StepFingerprint]:
    """:func:`.step.train_step_streamed` (``state`` consumed, new moments to ``sink``; ``reread``
    and ``spill_dir`` as there) and the step's :class:`StepFingerprint`: :func:`fingerprinted_step`
    for a state held a tensor at a time. The fingerprint needs the losses only, so the gradients
    stay streamed."""
    be = backend or default_backend(state.config)
    recorder = _Recorder(state.config, topology, be)
    step = state.step
    params, report, beta1_pow, beta2_pow = train_step_streamed(state, batch, topology, sink, backend=be,
                                                               losses=recorder.loss, reread=reread,
                                                               spill_dir=spill_dir)  # fmt: skip
    fingerprint = StepFingerprint(step, recorder.slot_losses(), f32_bits(report.loss), f32_bits(report.grad_norm),
                                  f32_bits(report.clip_coef))
    return params, report, beta1_pow, beta2_pow, fingerprint


def _recorded_gradients(state: TrainState, batch: np.ndarray, topology: Topology, be, keep: tuple[int, ...]):
    """:func:`.step.step_gradients` observed by a :class:`_Recorder`: (loss, summed gradients, recorder)."""
    check_batch(batch, state.config, topology)
    recorder = _Recorder(state.config, topology, be, keep)
    loss, grads = step_gradients(state, batch, topology, be, recorder)
    return loss, grads, recorder


@dataclass(frozen=True)
class ChunkOpening:
    """Chunk ``index`` of every micro-batch's gradient (slot order) and of the summed gradient."""

    index: int
    micro: tuple[np.ndarray, ...]
    summed: np.ndarray


def answer_challenge(state: TrainState, batch: np.ndarray, topology: Topology, chunks: tuple[int, ...], *,
                     backend=None) -> tuple[ChunkOpening, ...]:
    """The trainer's answer to a challenge of ``chunks`` of step ``state.step``: the step's
    gradients recomputed once (not its update, which the answer does not need), keeping only the
    challenged chunks."""
    be = backend or default_backend(state.config)
    _, grads, recorder = _recorded_gradients(state, batch, topology, be, tuple(chunks))
    summed = _Gradient(grads, state.config, be)
    slots = range(topology.ranks * topology.micro_batches)
    return tuple(ChunkOpening(c, tuple(recorder.kept[s][c] for s in slots), summed.chunk(c)) for c in chunks)


class Caught(str, enum.Enum):
    """Which link of a step a spot check found broken (docs/run-format.md §10.3); NONE: all held."""

    NONE = "none"
    LOSS = "loss"  # the recomputed slot's loss differs from the committed one
    GRADIENT = "gradient"  # the answered chunks of the secret slot differ from its recomputation
    LOSS_SUM = "loss_sum"  # the committed losses do not sum to the step's loss
    PROOF = "proof"  # the answer is malformed (not the challenged chunks of the run's shape)
    SUM = "sum"  # the micro-batch chunks do not sum to the answered summed chunk
    UPDATE = "update"  # AdamW on the summed chunk does not give checkpoint k+1's chunk
    NO_ANSWER = "no_answer"  # the trainer did not answer in the stated time


def recompute_slot(fp: StepFingerprint, state: TrainState | PartState, batch: np.ndarray, topology: Topology, slot: int,
                   chunks: tuple[int, ...], *, backend=None) -> tuple[Caught, tuple[np.ndarray, ...]]:
    """Link 1: recompute ``slot`` (rank · micro_batches + micro-batch) of the step from ``state``
    (checkpoint k) and its committed ``batch``; compare its loss bits with ``fp``. Gives the verdict
    and the gradient's ``chunks``, which :func:`check_chunks` compares with the trainer's answer.
    About 1/(ranks × micro_batches) of a replay."""
    config = state.config
    check_batch(batch, config, topology)
    be = backend or default_backend(config)
    # a checkpoint held in part has its parameters whole but not its moments, which this link does not read
    params = be.load_state(state)[0] if isinstance(state, TrainState) else {
        name: be.upload(a) for name, a in state.params.items()}
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
                 before: TrainState | PartState, after: TrainState | PartState, topology: Topology, *,
                 backend=None) -> Caught:
    """Links 3 and 4 for every opened chunk: AdamW from checkpoint k (``before``) to checkpoint
    k+1 (``after``) on the answered summed chunk; then the secret ``slot``'s chunks against the
    verifier's recomputation ``mine`` (in ``openings``' order) and the sum in the step's order."""
    config = before.config
    be = backend or default_backend(config)
    slots = topology.ranks * topology.micro_batches
    for op in openings:
        length = chunk_length(config, op.index) if op.index < chunk_count(config) else -1
        # the answer's shape first: nothing is computed on arrays of a length the run does not give
        if length < 1 or len(op.micro) != slots or any(
                not isinstance(a, np.ndarray) or a.dtype != _F32 or a.shape != (length,) for a in (op.summed, *op.micro)):
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


def _elements(group: Mapping[str, np.ndarray] | HeldChunks, name: str, part: slice) -> np.ndarray:
    """Elements ``part`` of parameter ``name`` in one group of a state: a view of its array, or
    read (and checked) from a checkpoint held in part (:mod:`.spot_state`)."""
    if isinstance(group, HeldChunks):
        return group.elements(name, part)
    return group[name].reshape(-1)[part]


def _update_holds(op: ChunkOpening, before: TrainState | PartState, after: TrainState | PartState, coef: np.float32,
                  be) -> bool:
    """AdamW of every parameter's part of chunk ``op.index`` gives ``after``'s params, m and v there."""
    scalars, _, _ = adamw_scalars(before)
    lo, hi, offset = op.index * CHUNK_ELEMENTS, op.index * CHUNK_ELEMENTS + op.summed.shape[0], 0
    for name, shape in before.config.param_shapes().items():
        size = math.prod(shape)
        a, b = max(lo, offset), min(hi, offset + size)
        if a < b:
            part = slice(a - offset, b - offset)
            old = [np.ascontiguousarray(_elements(t, name, part)) for t in (before.params, before.m, before.v)]
            new = be.adamw(old[0], np.ascontiguousarray(op.summed[a - lo:b - lo]), old[1], old[2],
                           replace(scalars[name], coef=coef))
            want = (_elements(t, name, part) for t in (after.params, after.m, after.v))
            if any(np.asarray(x).tobytes() != w.tobytes() for x, w in zip(new, want)):
                return False
        offset += size
    return True
