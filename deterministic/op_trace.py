"""The op trace of a step (docs/protocol.md §18.1, run-format §11): every op's record, in the
order :func:`.step.train_step` runs the ops, and the trace root over them.

Tracing is a backend: ``train_step(…, trace=OpTrace())`` runs the step on
:class:`TracingBackend`, which calls the same kernels of the same inner backend and, as each op
returns, hashes its outputs where they lie (the chunk trees of
:mod:`open1b.protocol.dispute.trace`, over zero-copy views) and appends its record. The step's
code and bits are unchanged; tracing is off unless a trace is passed (a disputing replay passes
one, training does not).

Where an input came from is found by identity: each output array is registered under
``id(array)`` with a weak reference that proves the array is still the one registered (an id is
reused once its array dies), and a view with the same bytes (a reshape) resolves through
``.base``. State tensors are registered when the step loads them (``param/<n>``, ``adam_m/<n>``,
``adam_v/<n>``, with the state tree's roots).

The update's outputs are tensors of the new state, so the trace commits them by the state tree's
roots (§18.1, r20): their chunk digests are hashed on every core and kept in
:attr:`OpTrace.post_chunks`, from which the replay builds h_{k+1} without hashing them again.

The activation recompute (:func:`.gpt.forward_backward`) calls a block's forward kernels a
second time on the same inputs: an op whose kind, attributes and inputs equal an earlier
record's is that op, so its outputs take the earlier op's place and are neither hashed nor
recorded again (determinism makes them the same bits; the tests compare traces with and without
the recompute). ``zeros`` has no inputs and is recorded every time the step asks for it.

The micro-batch's tokens and targets come from the committed samples, not from an op: each is
recorded as a ``tokens`` op (no inputs) before its first reader, which a referee does not
re-execute (a dispute over them is one over the data, §18.8).

CPU backends only: a device backend's outputs would have to come to the host to be hashed.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field, replace
from collections.abc import Mapping

import cbor2
import numpy as np

from open1b.protocol.dispute.ops import KINDS
from open1b.protocol.dispute.trace import OP_TAG, chunk_tree
from open1b.protocol.hashing import blake2b256
from open1b.protocol.merkle import MerkleTree, merkle_root

from .checkpoint_stream import chunk_digests
from .errors import TraceError
from .optimizer import AdamWScalars


_NEGATIVE_ZERO = np.uint32(0x8000_0000)


def _bits(x) -> int:
    return int(np.float32(x).view(np.uint32))


def _raw(a: np.ndarray) -> memoryview:
    """The array's bytes, without a copy: every kernel output is C-contiguous."""
    if not a.flags.c_contiguous:
        raise TraceError(f"a traced tensor of shape {a.shape} is not C-contiguous")
    return memoryview(a.reshape(-1)).cast("B")


def _canonical_order(m: dict) -> dict:
    """``m`` with its text keys in canonical CBOR order (shorter first, then bytewise: cbor2's)."""
    return dict(sorted(m.items(), key=lambda item: (len(item[0].encode()), item[0].encode())))


def _dtype(a: np.ndarray) -> str:
    if a.dtype == np.float32:
        return "float32"
    if a.dtype == np.int32:
        return "int32"
    raise TraceError(f"a traced tensor has dtype {a.dtype}")


@dataclass(eq=False)
class OpTrace:
    """A step's op records and their leaves, filled by :class:`TracingBackend`.

    ``state_roots`` maps state tensor names to their state-tree roots when the caller has them
    (a replay that verified its checkpoint did hash every tensor); a missing one is hashed when
    the step loads the state. ``keep`` names positions whose inputs and outputs are kept as
    arrays in :attr:`kept` (copies: those few ops only): what a party needs to build a
    fraud proof at the op a bisection found (§18.3). ``post_chunks`` receives the state tree's
    chunk digests of the update's outputs under their names in the new state (``param/<n>``, …):
    the part of h_{k+1} the trace has hashed (:func:`.dispute_replay.state_hash_of_chunks`)."""

    state_roots: Mapping[str, bytes] = field(default_factory=dict)
    keep: frozenset[int] = frozenset()
    records: list[dict] = field(default_factory=list)
    leaves: list[bytes] = field(default_factory=list)
    kept: dict[int, tuple[list[np.ndarray], list[np.ndarray]]] = field(default_factory=dict)
    post_chunks: dict[str, list[bytes]] = field(default_factory=dict)

    @property
    def ops(self) -> int:
        return len(self.records)

    def tree(self) -> MerkleTree:
        """The trace tree (§18.1): its root is the trace root."""
        return MerkleTree(self.leaves)

    def append(self, record: dict) -> None:
        """Add ``record``, every map of which has its keys in canonical order (:meth:`TracingBackend._op`
        builds them so): its leaf is :func:`~open1b.protocol.dispute.trace.op_leaf`'s, whose canonical
        encoding sorts each map's keys (most of its time), from cbor2's plain encoding, which keeps
        their order and is otherwise canonical (shortest heads, definite lengths; a record holds no float)."""
        self.records.append(record)
        self.leaves.append(blake2b256(OP_TAG, cbor2.dumps(record)))


class _Registry:
    """Which op output (or state tensor) each live array is."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[weakref.ref, dict]] = {}

    def put(self, a: np.ndarray, entry: dict) -> None:
        self._by_id[id(a)] = (weakref.ref(a), entry)

    def get(self, a: np.ndarray) -> dict | None:
        hit = self._by_id.get(id(a))
        if hit is not None and hit[0]() is a and a.flags.c_contiguous:
            return hit[1]  # the registered array itself: its bytes and shape (nearly every input; no .ctypes)
        x = a.base
        while isinstance(x, np.ndarray):  # a view: the registered array's bytes only where it spans them all
            hit = self._by_id.get(id(x))
            if hit is not None and hit[0]() is x and x.ctypes.data == a.ctypes.data and x.nbytes == a.nbytes \
                    and a.flags.c_contiguous:
                return {**hit[1], "shape": list(a.shape)}
            x = x.base
        return None


class TracingBackend:
    """``inner``'s kernels, each op recorded into ``trace`` as it returns (module doc). Methods
    that are not ops (uploads, batch packing, the witness) are ``inner``'s own."""

    def __init__(self, inner, trace: OpTrace) -> None:
        if getattr(inner, "name", "").startswith("cuda"):
            raise TraceError("an op trace is produced on a CPU backend")
        self._inner, self.trace = inner, trace
        self.fused = False  # the trace lists the ops unfused (run-format §11): gpt.py asks the backend
        self._refs = _Registry()
        self._memo: dict[tuple, list[dict]] = {}
        self._tokens: np.ndarray | None = None  # the micro-batch's tokens, which scatter_add reads again

    def __getattr__(self, name):
        return getattr(self._inner, name)

    # ---- the record of one op ---------------------------------------------------------
    def _input(self, a: np.ndarray, kind: str) -> dict:
        entry = self._refs.get(a)
        if entry is None:
            if a.dtype != np.int32:
                raise TraceError(f"an input of {kind} comes from no traced op")
            entry = self._op("tokens", {}, [], [a])[0]  # committed samples: a data dispute (module doc)
        return entry

    def _op(self, kind: str, attrs: dict, inputs: list, outputs: list[np.ndarray],
            inputs_before: list[np.ndarray] | None = None, roots: list[bytes] | None = None) -> list[dict]:
        """Record op ``kind`` (``inputs`` are entries or arrays) with its ``outputs`` and register
        them; an op equal to an earlier one is that one (module doc). ``roots``: the outputs'
        roots, hashed by the caller (the update's, as the state tree's). Returns the outputs' entries."""
        attrs = _canonical_order(attrs)  # as every map of a record is (OpTrace.append)
        entries = [i if isinstance(i, dict) else self._input(i, kind) for i in inputs]
        key = None
        if entries:  # an entry's op and output (or state name) and shape say which bytes it is
            key = (kind, tuple(attrs.items()),
                   tuple((e.get("op"), e.get("out"), e.get("state"), tuple(e["shape"])) for e in entries))
            earlier = self._memo.get(key)
            if earlier is not None:
                for a, entry in zip(outputs, earlier):
                    self._refs.put(a, entry)
                return earlier
        pos = self.trace.ops
        roots = roots or [chunk_tree(_raw(a)).root for a in outputs]
        # every map's keys in canonical order (OpTrace.append)
        tensors = [{"root": r, "dtype": _dtype(a), "shape": list(a.shape)} for a, r in zip(outputs, roots)]
        self.trace.append({"pos": pos, "kind": kind, "attrs": attrs, "inputs": entries, "outputs": tensors})
        if pos in self.trace.keep:  # copies: a later op may overwrite them (scatter_add)
            self.trace.kept[pos] = ([np.array(a) for a in inputs_before or inputs], [np.array(a) for a in outputs])
        out = [{"op": pos, "out": o, **t} for o, t in enumerate(tensors)]
        for a, entry in zip(outputs, out):
            self._refs.put(a, entry)
        if key is not None:
            self._memo[key] = out
        return out

    # ---- the state -----------------------------------------------------------------------
    def load_state(self, state):
        """The inner backend's groups, every array registered as its state tensor: a dict's now, a
        group read from its checkpoint when asked (:class:`.checkpoint_stream.FileMoments`, whose
        arrays are new at each read) as each is read (:class:`_StateGroup`)."""
        groups = self._inner.load_state(state)
        out = []
        for prefix, group in zip(("param", "adam_m", "adam_v"), groups):
            if isinstance(group, dict):
                for name, a in group.items():
                    self._register_state(f"{prefix}/{name}", a)
            else:
                group = _StateGroup(self, prefix, group)
            out.append(group)
        return tuple(out)

    def _register_state(self, full: str, a: np.ndarray) -> np.ndarray:
        root = self.trace.state_roots.get(full)
        if root is None:
            root = chunk_tree(_raw(a), state=True).root
        self._refs.put(a, {"root": root, "dtype": _dtype(a), "shape": list(a.shape), "state": full})  # canonical order
        return a

    # ---- the ops of run-format §11.2 ---------------------------------------------------
    def embed(self, wte, wpe, tokens):
        x = self._inner.embed(wte, wpe, tokens)
        self._tokens = tokens
        self._op("embed", {}, [wte, wpe, tokens], [x])
        return x

    def rmsnorm(self, x, g, eps):
        y, rstd = self._inner.rmsnorm(x, g, eps)
        self._op("rmsnorm", {"eps_bits": _bits(eps)}, [x, g], [y, rstd])
        return y, rstd

    def rmsnorm_backward(self, x, g, rstd, dy, dres):
        dx, dg = self._inner.rmsnorm_backward(x, g, rstd, dy, dres)
        self._op("rmsnorm_backward", {}, [x, g, rstd, dy, dres], [dx, dg])
        return dx, dg

    def matmul(self, a, b, trans_a=False, trans_b=False, structure=0):
        out = self._inner.matmul(a, b, trans_a, trans_b, structure)
        self._op("matmul", {"trans_a": int(trans_a), "trans_b": int(trans_b), "structure": int(structure)}, [a, b],
                 [out])
        return out

    def split_heads(self, x, col0, width, seq_len, n_heads):
        out = self._inner.split_heads(x, col0, width, seq_len, n_heads)
        self._op("split_heads", {"col0": col0, "width": width, "seq_len": seq_len, "n_heads": n_heads}, [x], [out])
        return out

    def merge_heads(self, o, seq_len, n_heads):
        out = self._inner.merge_heads(o, seq_len, n_heads)
        self._op("merge_heads", {"seq_len": seq_len, "n_heads": n_heads}, [o], [out])
        return out

    def merge_qkv(self, dq, dk, dv, seq_len, n_heads):
        out = self._inner.merge_qkv(dq, dk, dv, seq_len, n_heads)
        self._op("merge_qkv", {"seq_len": seq_len, "n_heads": n_heads}, [dq, dk, dv], [out])
        return out

    def causal_softmax(self, s, scale):
        p = self._inner.causal_softmax(s, scale)
        self._op("causal_softmax", {"scale_bits": _bits(scale)}, [s], [p])
        return p

    def causal_softmax_backward(self, p, dp, scale):
        ds = self._inner.causal_softmax_backward(p, dp, scale)
        self._op("causal_softmax_backward", {"scale_bits": _bits(scale)}, [p, dp], [ds])
        return ds

    def add(self, a, b):
        out = self._inner.add(a, b)
        self._op("add", {}, [a, b], [out])
        return out

    def plus_zero(self, a):
        out = self._inner.plus_zero(a)
        entry = self._input(a, "plus_zero")
        # x + 0.0 is x bit for bit but at -0.0: without one, the output's bytes are its input's,
        # and so is its root (trace chunks both: an op's output), which is not hashed again
        same = "state" not in entry and not (a.view(np.uint32) == _NEGATIVE_ZERO).any()
        self._op("plus_zero", {}, [entry], [out], inputs_before=[a], roots=[entry["root"]] if same else None)
        return out

    def gelu(self, u):
        out = self._inner.gelu(u)
        self._op("gelu", {}, [u], [out])
        return out

    def gelu_backward(self, u, dy):
        out = self._inner.gelu_backward(u, dy)
        self._op("gelu_backward", {}, [u, dy], [out])
        return out

    def sum_rows(self, x):
        out = self._inner.sum_rows(x)
        self._op("sum_rows", {}, [x], [out])
        return out

    def zeros(self, shape):
        out = self._inner.zeros(shape)
        rows, cols = shape
        self._op("zeros", {"rows": rows, "cols": cols}, [], [out])
        return out

    def loss_and_grad(self, logits, targets, inv_n):
        loss, dlogits = self._inner.loss_and_grad(logits, targets, inv_n)
        self._op("cross_entropy", {"inv_n_bits": _bits(inv_n)}, [logits, targets], [loss, dlogits])
        return loss, dlogits

    def scatter_add_sorted(self, dwte, dx, order, starts) -> None:
        # In place: the record's first input is dwte as it was, so take its entry (and, for a
        # kept op, its bytes) before the kernel overwrites it.
        tokens = self._tokens
        if tokens is None:
            raise TraceError("scatter_add before any embed: no tokens to record it with")
        inputs = [self._input(dwte, "scatter_add"), dx, tokens]
        before = [dwte.copy(), dx, tokens] if self.trace.ops in self.trace.keep else None  # the kept op only
        self._inner.scatter_add_sorted(dwte, dx, order, starts)
        self._op("scatter_add", {}, inputs, [dwte], before)

    def clip_norm(self, grads: list, max_norm):
        # The backend's own clip_norm, in its two ops, so each sum of squares is a record.
        sums = []
        for g in grads:
            s = np.array([self._inner.sumsq(g)], np.float32)
            sums.append((s, self._op("sumsq", {}, [g], [s])[0]))
        clip = self._inner.clip(np.concatenate([s for s, _ in sums]), max_norm)
        self._op("clip", {"max_norm_bits": _bits(max_norm)}, [entry for _, entry in sums], [clip],
                 [s for s, _ in sums])
        return clip

    def adamw_all(self, params: dict, grads: dict, m: dict, v: dict, scalars: dict, clip):
        updated = self._inner.adamw_all(params, grads, m, v, scalars, clip)
        for name in params:
            self._record_adamw(replace(scalars[name], coef=clip[1]), [params[name], grads[name], m[name], v[name]],
                               [updated[0][name], updated[1][name], updated[2][name]])
        return updated

    def adamw(self, p, g, m, v, scalars: AdamWScalars):
        """One parameter's update (:func:`.step.finish_step_streamed`): the record :meth:`adamw_all`
        makes of it, at the same position (the parameters are updated in the same order)."""
        out = self._inner.adamw(p, g, m, v, scalars)
        self._record_adamw(scalars, [p, g, m, v], list(out))
        return out

    def _record_adamw(self, s: AdamWScalars, inputs: list, outputs: list) -> None:
        """The update's outputs are committed by the state tree's chunks (§18.1), kept under their
        names in the new state: the parameter's, from the state entry of its old value."""
        old = self._input(inputs[0], "adamw")
        name = old["state"].split("/", 1)[1]
        roots = []
        for prefix, a in zip(("param", "adam_m", "adam_v"), outputs):
            digests = chunk_digests(a)
            self.trace.post_chunks[f"{prefix}/{name}"] = digests
            roots.append(merkle_root(digests))
        self._op("adamw", dict(zip(KINDS["adamw"].attrs, map(_bits, s.args()))), [old, *inputs[1:]], outputs,
                 inputs_before=inputs, roots=roots)


class _StateGroup(Mapping):
    """A state group read when asked (``group``), each array registered as state tensor
    ``prefix/<name>`` by ``backend`` as it is read: the update finds its moments in the trace."""

    def __init__(self, backend: TracingBackend, prefix: str, group: Mapping) -> None:
        self._backend, self._prefix, self._group = backend, prefix, group

    def __getitem__(self, name: str) -> np.ndarray:
        return self._backend._register_state(f"{self._prefix}/{name}", self._group[name])

    def __iter__(self):
        return iter(self._group)

    def __len__(self) -> int:
        return len(self._group)
