"""One training step: the function both the trainer and the replayer call.

``train_step(state, batch, topology)`` computes, for every rank r and micro-batch μ, the loss
and gradients of ``batch[r, μ]`` (:func:`.gpt.forward_backward`, each scaled by one over the
step's target-token count), and sums them in the order of the run format:

1. within a rank, micro-batches in ascending order, folded from ``+0.0``;
2. across ranks, :mod:`.reduction`'s order with :data:`.reduction.RANK_GROUP` in place of
   ``K_CHUNK``: ranks folded in ascending order within consecutive groups, the group sums
   combined by the pairwise tree.

The loss is summed exactly like a gradient. Then the global gradient norm gives the clipping
coefficient and AdamW updates every parameter (:mod:`.optimizer`). One process replays a W-rank
step exactly because the order is a function of the topology alone.

The step is three pieces, each callable alone: :func:`rank_gradients` (one rank's term, from
its share of the batch), :func:`reduce_ranks` (the cross-rank sum of W terms in the fixed
order) and :func:`finish_step` (norm, clipping, AdamW and the :class:`StepReport`). The
one-process :func:`train_step` runs them in sequence; :mod:`.distributed` runs the first on
each rank's own process, exchanges the terms' bits, and runs the other two on every rank.

Its output bits are a pure function of (state bits, batch bits, topology) on every backend.
A step whose loss or gradient norm is not finite raises :class:`.errors.NonFiniteError`: NaN
payloads are not portable, so such a state could never be verified.
"""

from __future__ import annotations

import os
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Mapping

import numpy as np

from .backend import default_backend
from .config import GPTConfig, Topology
from .errors import BatchFormatError, NonFiniteError
from .gpt import forward_backward
from .op_trace import OpTrace, TracingBackend
from .optimizer import AdamWScalars
from .reduction import RANK_GROUP
from .spill import SpillFile, held
from .state import TrainState
from .witness import WITNESS_TREE

LOSS_KEY = "loss"


@dataclass(frozen=True, eq=False)
class StepReport:
    """What a step observed: the exact float32 mean loss *before* the update, the global
    gradient norm, the clipping coefficient applied, and the replay witness W_k
    (:mod:`.witness`), which only a replay of the step's forward and backward yields.

    The witness is hashed in the background while the step finishes; reading :attr:`witness`
    waits for it (pickling a report resolves it)."""

    loss: np.float32
    grad_norm: np.float32
    clip_coef: np.float32
    pending_witness: Future | bytes = field(repr=False)

    @property
    def witness(self) -> bytes:
        w = self.pending_witness
        return w if isinstance(w, bytes) else w.result()

    def __reduce__(self):
        return StepReport, (self.loss, self.grad_norm, self.clip_coef, self.witness)

    def _bits(self) -> tuple:
        return (np.float32(self.loss).tobytes(), np.float32(self.grad_norm).tobytes(),
                np.float32(self.clip_coef).tobytes(), self.witness)  # fmt: skip

    def __eq__(self, other) -> bool:
        return isinstance(other, StepReport) and self._bits() == other._bits()

    def __hash__(self) -> int:
        return hash(self._bits())


def check_batch(batch: np.ndarray, config: GPTConfig, topology: Topology) -> None:
    """Raise :class:`BatchFormatError` unless ``batch`` is int32
    (ranks, micro_batches, micro_batch_size, seq_len + 1) with tokens in ``[0, vocab_size)``."""
    shape = (topology.ranks, topology.micro_batches, topology.micro_batch_size, config.seq_len + 1)
    if not isinstance(batch, np.ndarray) or batch.dtype != np.int32:
        raise BatchFormatError(f"batch must be an int32 array, got {getattr(batch, 'dtype', type(batch))}")
    if batch.shape != shape:
        raise BatchFormatError(f"batch must have shape {shape}, got {batch.shape}")
    if batch.min() < 0 or batch.max() >= config.vocab_size:
        raise BatchFormatError(f"batch tokens must be in [0, {config.vocab_size})")


class _GroupedTree:
    """Sums pushed terms in :mod:`.reduction`'s order with chunks of ``group``: a fold from +0.0
    within each group (``plus_zero`` is its first step), then the streaming pairwise tree over
    group sums (:func:`.reduction.stack_push`'s binary counter). Terms are dicts of arrays summed
    key by key with ``add``."""

    def __init__(self, group: int, add: Callable, plus_zero: Callable) -> None:
        # a partial sum parked in ``park`` (a :class:`.spill.Spilled`) comes back when a term is added to it
        self.group, self.add, self.plus_zero = group, lambda a, b: add(held(a), held(b)), plus_zero
        self.stack: list[dict | None] = []
        self.count = 0  # group sums pushed into the tree
        self.acc: dict | None = None
        self.in_group = 0
        self._started: set[str] = set()  # keys of the term push_key is streaming in
        self._fresh = False  # that term starts a group (its keys are folded from +0.0)
        self.park: SpillFile | None = None  # where push_key's sums wait for the next term's key

    def push(self, term: dict) -> None:
        """Add ``term``, which is consumed: its arrays are replaced or dropped one key at a time,
        so the sum never holds a second copy of every gradient."""
        if self.acc is None:
            for k in term:
                term[k] = self.plus_zero(term[k])
            self.acc = term
        else:
            _add_into(self.acc, term, self.add)
        self.in_group += 1
        if self.in_group == self.group:
            self._push_group()

    def push_key(self, key: str, value) -> None:
        """One key of the next term, added as :meth:`push` adds the whole term (keys are summed
        independently, so a term may come in a key at a time, as a backward makes it); the term
        ends with :meth:`end_term`."""
        if not self._started:  # the term's first key: does the term start a group?
            self._fresh = self.acc is None
            if self._fresh:
                self.acc = {}
        self._started.add(key)
        value = self.plus_zero(value) if self._fresh else self.add(self.acc[key], value)
        self.acc[key] = value if self.park is None else self.park.put(value)

    def end_term(self) -> None:
        """The term :meth:`push_key` streamed in is complete."""
        self._started = set()
        self.in_group += 1
        if self.in_group == self.group:
            self._push_group()

    def _push_group(self) -> None:
        value, self.acc, self.in_group = self.acc, None, 0
        level = 0
        while (self.count >> level) & 1:
            left, self.stack[level] = self.stack[level], None
            _add_into(left, value, self.add)
            value = left
            level += 1
        if level == len(self.stack):
            self.stack.append(None)
        self.stack[level] = value
        self.count += 1

    def total(self) -> dict:
        if self.acc is not None:
            self._push_group()
        total = None
        for level in range(len(self.stack)):
            if (self.count >> level) & 1:
                block = self.stack[level]
                if total is not None:
                    _add_into(block, total, self.add)
                total = block
        return total


def _add_into(left: dict, right: dict, add: Callable) -> None:
    """``left[k] = add(left[k], right[k])`` for every key, emptying ``right`` as it goes."""
    for k in list(right):
        left[k] = add(left[k], right.pop(k))


def _inv_tokens(config: GPTConfig, topology: Topology) -> np.float32:
    """One over the step's target-token count (all ranks together): every micro-batch's scale."""
    return np.float32(1) / np.float32(topology.sequences * config.seq_len)


MicroObserver = Callable[[int, int, object, dict], None]
"""``observe(rank, micro_batch, loss, grads)``: sees each micro-batch's loss and gradients (backend
arrays) as the step computes them, before they are summed; the fingerprints (:mod:`.fingerprint`)."""

LossObserver = Callable[[int, int, object], None]
"""``losses(rank, micro_batch, loss)``: sees each micro-batch's loss alone (a trainer's fingerprints
need no gradient), so, unlike a :data:`MicroObserver`, it leaves the streamed sums streamed."""


def _rank_term(params: dict, micros: list, inv_n: np.float32, config: GPTConfig, be,
               observe: MicroObserver | None = None, rank: int = 0, recompute: bool = True,
               into: _GroupedTree | None = None, release: Callable | None = None,
               park: SpillFile | None = None, losses: LossObserver | None = None) -> dict | None:
    """Rank ``rank``'s term: its micro-batches folded from +0.0. With ``into`` (and no ``observe``,
    which sees whole gradients), the term goes into that tree a key at a time instead, each
    gradient of the last micro-batch folded and added as soon as its backward makes it final, and
    None is returned: the same additions in the same order, without a second whole gradient.
    ``park`` (streamed only) does the same for the earlier micro-batches, whose fold waits in that
    file between them: the rank holds no whole gradient until its last backward. Without it the
    earlier micro-batches are folded whole, after each backward, which is the order of the op
    trace (run-format §11.2; a traced step never parks: a read-back array is not the op's output).
    ``release`` (streamed only) goes to the last micro-batch's :func:`.gpt.forward_backward`.
    ``losses`` sees each micro-batch's loss as its forward computes it."""
    see = (lambda index, loss: losses(rank, index, loss)) if losses is not None else (lambda index, loss: None)
    micro = _GroupedTree(len(micros), be.add, be.plus_zero)  # one group: a plain fold from +0.0
    streamed = into is not None and observe is None
    for index, mb in enumerate(micros):
        if streamed and index == len(micros) - 1:
            micro.park = None  # the last micro-batch's sums go on into the rank sum at once

            def fold_and_add(name: str, grad) -> None:
                micro.push_key(name, grad)  # the fold is one group: its sum is the group's accumulator
                into.push_key(name, micro.acc.pop(name))

            loss, _ = forward_backward(params, mb, inv_n, config, be, recompute=recompute, on_grad=fold_and_add,
                                       release=release)
            see(index, loss)
            fold_and_add(LOSS_KEY, loss)
            into.end_term()
            return None
        if streamed and park is not None:  # each gradient folded as it is final, the fold parked
            micro.park = park
            loss, _ = forward_backward(params, mb, inv_n, config, be, recompute=recompute, on_grad=micro.push_key)
            see(index, loss)
            micro.push_key(LOSS_KEY, loss)
            micro.end_term()
            continue
        loss, grads = forward_backward(params, mb, inv_n, config, be, recompute=recompute)
        see(index, loss)
        if observe is not None:
            observe(rank, index, loss, grads)
        grads[LOSS_KEY] = loss
        micro.push(grads)
    return micro.total()


def rank_gradients(state: TrainState, share: np.ndarray, topology: Topology, be, *, rank: int = 0,
                   observe: MicroObserver | None = None) -> dict:
    """Rank r's term of the cross-rank sum, from its share ``batch[r]`` of the step's batch
    (``micro_batches × micro_batch_size × (seq_len + 1)``) alone: its micro-batches' gradients
    and loss shares folded in ascending order from ``+0.0`` (step 1 of the module doc), the loss
    under :data:`LOSS_KEY` as a (1,) array. Backend arrays.

    This is all a data-parallel rank computes by itself (:mod:`.distributed`); the scale is one
    over the *step's* token count, so the term depends on the topology, not only on the share.
    ``observe`` sees each micro-batch as (``rank``, micro-batch, loss, gradients), as in :func:`train_step`.
    Raises :class:`BatchFormatError` unless ``share`` is one rank's share of such a batch.
    """
    check_batch(share[None] if isinstance(share, np.ndarray) else share, state.config, replace(topology, ranks=1))
    params, _, _ = be.load_state(state)
    micros = be.micro_batches(share[None], state.config.vocab_size)[0]
    return _rank_term(params, micros, _inv_tokens(state.config, topology), state.config, be, observe, rank)


def reduce_ranks(terms: Iterable[dict], be) -> tuple[object, dict]:
    """The step's mean loss (a (1,) backend array) and summed gradients from the rank terms
    (:func:`rank_gradients`) given in ascending rank order, summed in the cross-rank order
    (step 2 of the module doc).

    Consumes ``terms`` as it goes and keeps O(log W) partial sums, so a generator of terms
    never holds every rank's gradients at once; each term dict is emptied (its arrays replaced or
    dropped one by one), so no second copy of a rank's gradients outlives its addition. The bits depend on the terms' bits and their
    order only, not on which process computed each term.
    """
    tree = _GroupedTree(RANK_GROUP, be.add, be.plus_zero)
    for term in terms:
        tree.push(term)
    return _reduced(tree)


def _reduced(tree: _GroupedTree) -> tuple[object, dict]:
    if tree.count == 0 and tree.acc is None:
        raise ValueError("reduce_ranks needs at least one rank term")
    summed = {key: held(value) for key, value in tree.total().items()}
    return summed.pop(LOSS_KEY), summed


def step_gradients(state: TrainState, batch: np.ndarray, topology: Topology, be,
                   observe: MicroObserver | None = None, *, recompute: bool = True,
                   spill: SpillFile | None = None, losses: LossObserver | None = None) -> tuple[object, dict]:
    """The step's mean loss and summed gradients (backend arrays), in the order of the module doc:
    every rank's term computed here, one after the other, and reduced as they come. The batch
    goes to the backend once (:meth:`micro_batches`), the parameters not at all when they are
    already there (:meth:`load_state`). ``observe`` sees every micro-batch on the way, ``losses``
    every micro-batch's loss (:data:`LossObserver`).
    ``recompute`` (:func:`.gpt.forward_backward`) changes the memory and time, never the bits.

    ``spill`` (host arrays only, and no ``observe``) is for a state whose parameters can be read
    again from where they were checked: every rank's partial sums but the last's wait in that file
    as they come (each read back when the next rank's gradient is added to it), and the last
    backward lets go of each parameter after its last use (it leaves ``state.params``), so the
    parameters and the gradient sum are never both whole in memory; a rank's earlier micro-batches
    fold each gradient as it is final into a sum that waits in that file too. The same bits."""
    config = state.config
    inv_n = _inv_tokens(config, topology)
    params, _, _ = be.load_state(state)
    micros = be.micro_batches(batch, config.vocab_size)
    # each rank's term added into the cross-rank sum as its last backward makes each gradient final:
    # the sum and one micro-batch's gradients are alive, never two ranks' whole gradients
    tree = _GroupedTree(RANK_GROUP, be.add, be.plus_zero)
    last = topology.ranks - 1
    release = None if spill is None else lambda names: [params.pop(name) for name in names]
    for rank in range(topology.ranks):
        tree.park = spill if rank < last else None  # each sum waits on disk as it comes, but the last
        term = _rank_term(params, micros[rank], inv_n, config, be, observe, rank, recompute, into=tree,
                          release=release if rank == last else None, park=spill, losses=losses)
        if term is not None:  # observed: the term came whole
            tree.push(term)
    loss, summed = _reduced(tree)
    return loss, {name: summed[name] for name in config.param_shapes()}  # in the model's order, as they came whole


def adamw_scalars(state: TrainState) -> tuple[dict[str, AdamWScalars], np.float32, np.float32]:
    """Step ``state.step``'s AdamW coefficients of every parameter (without the clipping
    coefficient) and the new bias-correction powers; also what a spot check's update check uses."""
    config = state.config
    hp = config.hyper32()
    beta1_pow = np.float32(state.beta1_pow * hp["beta1"])  # beta1**(step+1), one rounding per step
    beta2_pow = np.float32(state.beta2_pow * hp["beta2"])
    scalars = {
        name: AdamWScalars.for_step(
            lr=hp["lr"], beta1=hp["beta1"], beta2=hp["beta2"], eps=hp["eps"],
            weight_decay=hp["weight_decay"] if len(shape) >= 2 else np.float32(0),
            beta1_pow=beta1_pow, beta2_pow=beta2_pow,
        )
        for name, shape in config.param_shapes().items()
    }  # fmt: skip
    return scalars, beta1_pow, beta2_pow


def finish_step(state: TrainState, loss, grads: dict, be, *, witness_rule: str = WITNESS_TREE
                ) -> tuple[TrainState, StepReport]:
    """The rest of a step once its mean ``loss`` ((1,) backend array) and summed, pre-clip
    ``grads`` (backend arrays, from :func:`reduce_ranks`) are known: the global gradient norm,
    the clipping coefficient, the replay witness, one AdamW update of every parameter, and the
    :class:`StepReport`.

    The one place a report is built, so the one-process step and every rank of the distributed
    trainer derive the same witness from the same bits. On a device backend everything up to
    the witness's bytes stays on the device: the gradients and the step's three scalars come to
    the host in one transfer, which the update kernels overlap, and are hashed in the
    background. ``witness_rule`` is the run's (:mod:`.witness`; every new run's is the default).
    Raises :class:`NonFiniteError` as :func:`train_step` does.
    """
    config = state.config
    order = list(config.param_shapes())
    clip = be.clip_norm([grads[name] for name in order], config.hyper32()["grad_clip"])
    scalars_of = be.start_witness(loss, grads, order, clip, witness_rule)
    scalars, beta1_pow, beta2_pow = adamw_scalars(state)
    params, m, v = be.load_state(state)
    updated = be.adamw_all(params, grads, m, v, scalars, clip)
    done = scalars_of()
    if not (np.isfinite(done.loss) and np.isfinite(done.grad_norm)):
        raise NonFiniteError(f"step {state.step}: loss {done.loss}, gradient norm {done.grad_norm}")
    new_state = be.to_state(config, updated, state.step + 1, beta1_pow, beta2_pow)
    return new_state, StepReport(done.loss, done.grad_norm, done.clip_coef, done.witness)


MomentSink = Callable[[str, np.ndarray], None]
"""``sink(name, array)``: receives each new moment tensor, ``adam_m/<n>`` then ``adam_v/<n>`` for every
parameter n in order, as the update computes it (:class:`.checkpoint_stream.StateSink` hashes and writes it)."""


def finish_step_streamed(state: TrainState, loss, grads: dict, be, sink: MomentSink, *,
                         witness_rule: str = WITNESS_TREE, reread: Mapping[str, np.ndarray] | None = None
                         ) -> tuple[dict, StepReport, np.float32, np.float32]:
    """:func:`finish_step` one parameter at a time, for a state too large to hold twice: the same
    norm, clipping, witness (computed and called as there) and AdamW kernels, so the same bits.

    Each parameter's moments are read from ``state`` when its update runs (a state from
    :func:`.checkpoint_stream.file_state` reads them from its checkpoint then), its new moments go
    to ``sink`` and are not kept, and its old value leaves ``state.params`` (``reread`` gives one
    that is no longer there: read back from its checkpoint) as its gradient leaves ``grads``:
    ``state`` and ``grads`` are **consumed** and must not be used again. Returns the new parameters
    (in the model's order), the report and the new bias-correction powers. CPU backends only: a
    device backend keeps the whole state there.
    Raises :class:`NonFiniteError` as :func:`train_step` does, before anything is updated."""
    config = state.config
    order = list(config.param_shapes())
    clip = be.clip_norm([grads[name] for name in order], config.hyper32()["grad_clip"])
    scalars_of = be.start_witness(loss, grads, order, clip, witness_rule)
    scalars, beta1_pow, beta2_pow = adamw_scalars(state)
    done = scalars_of()
    if not (np.isfinite(done.loss) and np.isfinite(done.grad_norm)):
        raise NonFiniteError(f"step {state.step}: loss {done.loss}, gradient norm {done.grad_norm}")
    # the update lets each gradient go as it uses it, so the witness must have read them all: a
    # witness still hashing would keep every gradient alive beside the new parameters
    done.witness.result()
    # the backend's view of the state (a tracing backend registers each moment as it is read);
    # on the CPU, the state's own mappings
    (old, m_of, v_of), params = be.load_state(state), {}
    for name in order:
        p, m, v = be.adamw(old.pop(name) if name in old else reread[name], grads.pop(name), m_of[name], v_of[name],
                           replace(scalars[name], coef=done.clip_coef))
        sink(f"adam_m/{name}", m)
        sink(f"adam_v/{name}", v)
        p.flags.writeable = False
        params[name] = p
    return params, StepReport(done.loss, done.grad_norm, done.clip_coef, done.witness), beta1_pow, beta2_pow


def train_step_streamed(state: TrainState, batch: np.ndarray, topology: Topology, sink: MomentSink, *, backend=None,
                        observe: MicroObserver | None = None, losses: LossObserver | None = None,
                        recompute: bool = True, witness_rule: str = WITNESS_TREE,
                        reread: Mapping[str, np.ndarray] | None = None,
                        spill_dir: str | os.PathLike | None = None) -> tuple[dict, StepReport, np.float32, np.float32]:
    """:func:`train_step` with :func:`finish_step_streamed` in place of :func:`finish_step`: the
    same bits, ``state`` consumed, the new moments handed to ``sink`` (see there).

    ``reread`` (no ``observe``): ``state``'s parameters read back from the checkpoint they were
    checked in (:class:`.checkpoint_stream.FileMoments` of ``param``). With it, the earlier ranks'
    gradient sums wait in a temporary file in ``spill_dir`` (required then: :mod:`.spill`) and each parameter is let go after its last use in the last backward and read
    back for its update (:func:`step_gradients`' ``spill``): the parameters and the gradient sum
    are never both whole in memory. ``losses`` (:data:`LossObserver`) sees every micro-batch's loss
    on either path."""
    check_batch(batch, state.config, topology)
    be = backend or default_backend(state.config)
    if reread is None or observe is not None:
        loss, grads = step_gradients(state, batch, topology, be, observe, recompute=recompute, losses=losses)
    elif spill_dir is None:
        raise ValueError("a step that reads its parameters back needs spill_dir, the directory of its spill file")
    else:
        with SpillFile(spill_dir) as spill:
            loss, grads = step_gradients(state, batch, topology, be, recompute=recompute, spill=spill, losses=losses)
    return finish_step_streamed(state, loss, grads, be, sink, witness_rule=witness_rule, reread=reread)


def train_step(
    state: TrainState, batch: np.ndarray, topology: Topology, *, backend=None, observe: MicroObserver | None = None,
    witness_rule: str = WITNESS_TREE,
    recompute: bool = True,
    trace: OpTrace | None = None,
) -> tuple[TrainState, StepReport]:
    """Forward, backward, gradient reduction, clipping and one AdamW update.

    Returns a new state (``step + 1``) and a :class:`StepReport`; ``state`` is not modified.
    ``backend`` (default: :func:`.backend.default_backend`) changes the speed, never the bits.
    It is :func:`step_gradients` (every rank's :func:`rank_gradients`, then :func:`reduce_ranks`)
    followed by :func:`finish_step`; the distributed trainer runs the same three pieces.
    ``observe`` (:data:`MicroObserver`) sees every micro-batch's loss and gradients; it changes no bit.
    ``witness_rule`` is how the report's witness is hashed (a replay passes its run's).
    ``recompute`` (:func:`.gpt.forward_backward`: one block's activations alive at a time) neither.
    ``trace`` (off by default; a disputing replay passes an empty :class:`.op_trace.OpTrace`) is
    filled with the step's op records as the ops run (:class:`.op_trace.TracingBackend`): the
    same kernels and bits, each output hashed where it lies.
    """
    config = state.config
    check_batch(batch, config, topology)
    be = backend or default_backend(config)
    if trace is not None:
        be = TracingBackend(be, trace)
    loss, grads = step_gradients(state, batch, topology, be, observe, recompute=recompute)
    return finish_step(state, loss, grads, be, witness_rule=witness_rule)
