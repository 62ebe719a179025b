"""The data-parallel trainer: W processes under ``torch.distributed`` (gloo), one rank each,
producing exactly the states of the one-process :func:`.step.train_step`.

Each step, rank r

1. derives the step's batch from the run's batch function (a pure function of the step, so
   no rank sends data to another) and computes, from its share ``batch[r]`` alone, its rank
   term: :func:`.step.rank_gradients` (its micro-batches folded in ascending order);
2. packs the term into one float32 *exchange vector* (every parameter's gradient in canonical
   order, the loss share, then 32 bytes naming the share it consumed) and all-gathers the W
   vectors. An all-gather copies bytes; nothing is added in transit. ``all_reduce`` is never
   used: its summation order is the library's, not the run format's;
3. reduces the W terms in ascending rank order with :func:`.step.reduce_ranks` — the same
   function, the same order, the same input bits as the one-process step — and applies
   :func:`.step.finish_step` (norm, clipping, witness, AdamW) to its own replica of the state.

So every rank holds bit-identical states, equal to those of ``train_step`` on the full batch
(docs/run-format.md §7). Rank 0 runs in the caller's process and yields its states; ranks
1 … W-1 are spawned processes (``multiprocessing`` spawn; never fork, which would copy numba's
and torch's threads). They meet through a ``TCPStore`` on 127.0.0.1 at a free port.

Failure handling: workers ignore SIGINT (the caller's process owns Ctrl-C and ends them), are
daemonic, and are terminated when the generator finishes, fails or is closed. A worker that
raises writes its traceback, as text, into the store before it exits; a rank that dies or stops
answering makes the exchange fail (gloo notices a closed connection at once, a silent rank after
``exchange_timeout_s``). Rank 0 then raises :class:`.errors.DistributedError` naming the rank
it could blame. Nothing a worker sends is unpickled by rank 0: the store holds text and the
exchange holds float32 bits.

torch is imported only here, when a distributed run starts; replaying never needs it.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import math
import multiprocessing
import os
import pickle
import signal
import time
import tempfile
import traceback
from pathlib import Path
from typing import Callable, Generator, Iterator

import numpy as np
from safetensors.numpy import load_file as load_safetensors
from safetensors.numpy import save_file as save_safetensors

from .backend import default_backend
from .config import GPTConfig, Topology
from .errors import ConfigError, DistributedError
from .fingerprint import StepFingerprint, f32_bits, fingerprinted_step
from .jit import SOURCE_DIGEST
from .selfcheck import require_deterministic_machine
from .state import TrainState
from .step import LOSS_KEY, StepReport, check_batch, finish_step, rank_gradients, reduce_ranks, train_step

BatchFn = Callable[[int], np.ndarray]
"""The run's batch schedule: step k -> its int32 (ranks, micro_batches, rows, seq_len + 1) batch.
For W > 1 it is pickled to every worker, so it must be a module-level function or a
``functools.partial`` of one, and it must be pure (every rank calls it)."""

StateEdit = Callable[[TrainState], TrainState]
"""Applied to the state after every step, on every rank (the devnet's forged runs use it)."""

Step = tuple[TrainState, np.ndarray, StepReport]
"""What each iteration yields: the state after step k, the batch of step k and its report."""

OnFingerprint = Callable[[StepFingerprint], None]
"""Receives step k's fingerprint before step k is yielded (the trainer writes them to the run)."""

HOST = "127.0.0.1"
START_TIMEOUT_S = 600.0
"""How long ranks may take to start: import torch and numba, load (or compile) the kernels and
pass the self-checks. Generous because a cold numba cache compiles for minutes on a small CPU."""
EXCHANGE_TIMEOUT_S = 300.0
"""How long a rank waits in one exchange for the slowest rank's term."""
BLAME_GRACE_S = 5.0
"""After a failed exchange, how long rank 0 waits for the workers' error reports."""
STOP_GRACE_S = 5.0
"""How long a worker has to exit after SIGTERM before it is killed."""

_SHARE_TAG = b"open1b/rank-share/v1\x00"
_DIGEST_BYTES = 32
_PRINT_WORDS = 1  # a micro-batch's loss bits
_STORE_PREFIX = "open1b/pg"
_COMPUTE, _EXCHANGE = b"compute", b"exchange"
_HANDOFF_STATE, _HANDOFF_RUN = "state0.safetensors", "run.pickle"
WORKER_NAME = "open1b-rank-"
"""Worker processes are named ``open1b-rank-<r>`` (``multiprocessing.current_process().name``)."""


def share_digest(share: np.ndarray) -> bytes:
    """B2 of the int32 little-endian bytes of one rank's share of a batch: what the exchange
    vector names, so that every rank checks that all of them consumed the same batch."""
    return hashlib.blake2b(_SHARE_TAG + np.ascontiguousarray(share, "<i4").tobytes(), digest_size=32).digest()


class ExchangeLayout:
    """Where each piece of a rank term sits in its exchange vector (float32 words): every
    parameter's gradient in canonical order (C order), the loss share, then the share digest's
    32 bytes carried as 8 words of raw bits; for a run that records fingerprints, then each of
    the rank's ``micro_prints`` micro-batches' loss bits (1 word), raw bits too
    (docs/run-format.md §10.1: rank 0 assembles the step's fingerprint)."""

    def __init__(self, config: GPTConfig, micro_prints: int = 0) -> None:
        self.slots: dict[str, tuple[int, tuple[int, ...]]] = {}
        offset = 0
        for name, shape in {**config.param_shapes(), LOSS_KEY: (1,)}.items():
            self.slots[name] = (offset, shape)
            offset += math.prod(shape)
        self.digest_at = offset
        self.prints_at = offset + _DIGEST_BYTES // 4
        self.micro_prints = micro_prints
        self.size = self.prints_at + micro_prints * _PRINT_WORDS

    def pack(self, term: dict[str, np.ndarray], digest: bytes, out: np.ndarray,
             prints: list[int] = ()) -> None:  # fmt: skip
        for name, (offset, shape) in self.slots.items():
            out[offset : offset + math.prod(shape)] = term[name].reshape(-1)
        out[self.digest_at : self.prints_at].view(np.uint8)[:] = np.frombuffer(digest, np.uint8)
        if len(prints) != self.micro_prints:
            raise ValueError(f"{len(prints)} micro-batch fingerprints for a layout of {self.micro_prints}")
        out[self.prints_at :].view("<u4")[:] = np.asarray(prints, "<u4")

    def unpack(self, vector: np.ndarray) -> tuple[dict[str, np.ndarray], bytes]:
        """Views into ``vector`` (no copies) and the digest."""
        term = {name: vector[o : o + math.prod(s)].reshape(s) for name, (o, s) in self.slots.items()}
        return term, vector[self.digest_at : self.prints_at].tobytes()

    def prints(self, vector: np.ndarray) -> list[int]:
        """The loss bits of each micro-batch of the rank that packed ``vector``."""
        return [int(b) for b in vector[self.prints_at :].view("<u4")]


def local_steps(
    state0: TrainState, batch_fn: BatchFn, topology: Topology, steps: int, *,
    after_step: StateEdit | None = None, backend=None, on_fingerprint: OnFingerprint | None = None,
) -> Iterator[Step]:  # fmt: skip
    """The one-process equivalent of :func:`distributed_steps`: ``steps`` calls of
    :func:`.step.train_step`, step k on ``batch_fn(k)`` (k counts from ``state0.step``). With
    ``on_fingerprint``, each step is :func:`.fingerprint.fingerprinted_step` (the same bits) and
    its fingerprint is handed over before the step is yielded."""
    state = state0
    for _ in range(steps):
        batch = batch_fn(state.step)
        if on_fingerprint is None:
            state, report = train_step(state, batch, topology, backend=backend)
        else:
            state, report, fingerprint = fingerprinted_step(state, batch, topology, backend=backend)
            on_fingerprint(fingerprint)
        if after_step is not None:
            state = after_step(state)
        yield state, batch, report


def run_steps(
    state0: TrainState, batch_fn: BatchFn, topology: Topology, steps: int, *, world: int = 1,
    after_step: StateEdit | None = None, backend=None, on_fingerprint: OnFingerprint | None = None,
) -> Iterator[Step]:  # fmt: skip
    """The trainer's one loop: :func:`local_steps` (on ``backend``, default the CPU's) when
    ``world`` is 1; :func:`launched_steps` when a launcher started this process as one of
    ``world`` ranks (:func:`launched_rank`); else :func:`distributed_steps`, which starts
    ``world`` CPU processes here. All yield the same bits. ``on_fingerprint`` receives every
    step's fingerprint (docs/run-format.md §10.1) before the step is yielded."""
    launched = launched_rank()
    if world == 1 and launched is None:
        return local_steps(state0, batch_fn, topology, steps, after_step=after_step, backend=backend,
                           on_fingerprint=on_fingerprint)
    if backend is not None:
        raise ConfigError("data-parallel training (world > 1) runs on the CPU backend only")
    if launched is not None:  # a launcher started every rank, here and on other machines
        rank, launched_world = launched
        if launched_world != world:
            raise ConfigError(f"WORLD_SIZE {launched_world} does not match the {world} ranks asked for")
        return launched_steps(state0, batch_fn, topology, steps, rank=rank, world=world, after_step=after_step,
                              on_fingerprint=on_fingerprint)
    return distributed_steps(state0, batch_fn, topology, steps, world=world, after_step=after_step,
                             on_fingerprint=on_fingerprint)


LAUNCH_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
"""What a ``torch.distributed`` launcher (``torchrun``, or a scheduler that follows its
conventions) sets in every process it starts; ``LOCAL_WORLD_SIZE`` (ranks on this machine) is
read too, to share the cores."""


def launched_rank() -> tuple[int, int] | None:
    """``(rank, world)`` when a launcher started this process (:data:`LAUNCH_ENV` set), else None;
    :class:`.errors.ConfigError` when only some of the variables are set or they make no sense."""
    present = [k for k in LAUNCH_ENV if k in os.environ]
    if not present:
        return None
    if len(present) != len(LAUNCH_ENV):
        raise ConfigError(f"a launched rank needs all of {', '.join(LAUNCH_ENV)}; set: {', '.join(present)}")
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except ValueError as exc:
        raise ConfigError(f"RANK and WORLD_SIZE must be integers: {exc}") from exc
    if not 0 <= rank < world:
        raise ConfigError(f"RANK {rank} is not in [0, WORLD_SIZE {world})")
    return rank, world


def launched_steps(
    state0: TrainState, batch_fn: BatchFn, topology: Topology, steps: int, *, rank: int, world: int,
    after_step: StateEdit | None = None, exchange_timeout_s: float = EXCHANGE_TIMEOUT_S,
    on_fingerprint: OnFingerprint | None = None,
) -> Generator[Step, None, None]:  # fmt: skip
    """Rank ``rank`` of a run whose W processes a launcher started, on one machine or several
    (``torchrun --nnodes N --nproc-per-node P --rdzv-endpoint HOST:PORT`` on each): they meet
    at ``MASTER_ADDR:MASTER_PORT`` (``init_method="env://"``) and each step is exactly
    :func:`distributed_steps`' — the same exchange vector, all-gather and ascending-rank
    reduction — so every rank yields the states of the one-process :func:`.step.train_step`.

    Every rank computes ``state0`` and the batches itself (pure functions of the run's options),
    so nothing but exchange vectors crosses the network, and no rank unpickles another's bytes.
    At start-up the ranks all-gather their engine's :data:`.jit.SOURCE_DIGEST`: a machine running
    other engine code is refused (:class:`.errors.DistributedError` naming it) before any step.
    """
    import numba
    import torch
    import torch.distributed as dist

    if world != topology.ranks:
        raise ConfigError(f"WORLD_SIZE {world} does not match the topology's {topology.ranks} ranks")
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    threads = numba.get_num_threads()
    numba.set_num_threads(max(1, min(threads, (os.cpu_count() or 1) // max(1, local))))
    me = _Rank(rank, world, state0.config, topology, batch_fn, after_step, on_fingerprint is not None, True)
    require_deterministic_machine(me.be)
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=exchange_timeout_s))  # fmt: skip
    try:
        mine = torch.frombuffer(bytearray(bytes.fromhex(SOURCE_DIGEST)), dtype=torch.uint8)
        engines = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(engines, mine)
        for r, engine in enumerate(engines):
            if bytes(engine.numpy()) != bytes(mine.numpy()):
                raise DistributedError(f"rank {r} runs other engine source files than rank {rank} "
                                       f"({bytes(engine.numpy()).hex()} vs {SOURCE_DIGEST})", rank=r)  # fmt: skip
        state = state0
        for _ in range(steps):
            state, batch, report, fingerprint = me.step(state, me.all_gather)
            if fingerprint is not None and on_fingerprint is not None:
                on_fingerprint(fingerprint)
            yield state, batch, report
    finally:
        dist.destroy_process_group()
        numba.set_num_threads(threads)


def distributed_steps(
    state0: TrainState, batch_fn: BatchFn, topology: Topology, steps: int, *, world: int,
    after_step: StateEdit | None = None, start_timeout_s: float = START_TIMEOUT_S,
    exchange_timeout_s: float = EXCHANGE_TIMEOUT_S, on_fingerprint: OnFingerprint | None = None,
) -> Generator[Step, None, None]:  # fmt: skip
    """Train ``steps`` steps from ``state0`` with ``world`` processes, one rank each; yields
    ``(state after step k, batch of step k, report)`` from rank 0, in this process.

    Arguments are checked here, before anything starts: ``world`` must equal
    ``topology.ranks`` (:class:`.errors.ConfigError` otherwise), and ``batch_fn`` and
    ``after_step`` must be picklable. The workers start on the first ``next()``. Close the
    generator (``contextlib.closing``) to end them as soon as a loop is left early; a generator
    that is merely dropped ends them when it is collected, and they are daemonic in any case.

    Raises :class:`.errors.DistributedError` when a rank fails, dies or times out, and the
    engine's own errors (:class:`.errors.NonFiniteError`, :class:`.errors.BatchFormatError`)
    as :func:`.step.train_step` would.
    """
    if type(world) is not int or world < 1:
        raise ConfigError(f"world must be a positive int, got {world!r}")
    if world != topology.ranks:
        raise ConfigError(
            f"world {world} does not match the topology's {topology.ranks} ranks: each process computes "
            f"exactly one rank (set the topology's ranks to {world}, or train with {topology.ranks} processes)"
        )
    if type(steps) is not int or steps < 0:
        raise ConfigError(f"steps must be a non-negative int, got {steps!r}")
    for name, fn in (("batch_fn", batch_fn), ("after_step", after_step)):
        try:
            pickle.dumps(fn)  # our own object, pickled for our own spawned workers
        except Exception as exc:
            raise ConfigError(
                f"{name} must be picklable to reach the worker processes (a module-level function or a "
                f"functools.partial of one): {exc}"
            ) from exc
    timeouts = (float(start_timeout_s), float(exchange_timeout_s))
    return _rank0(state0, batch_fn, topology, steps, world, after_step, timeouts, on_fingerprint)


def _threads_per_rank(world: int) -> int:
    # W processes share the machine: each gets its part of the cores (speed only, never bits).
    import numba

    return max(1, min(numba.config.NUMBA_NUM_THREADS, (os.cpu_count() or 1) // world))


class _Rank:
    """One rank's side of a run: its replica of the state and its exchange buffers. With
    ``fingerprints``, every rank sends its micro-batches' fingerprints (every rank must agree: the
    flag sets the exchange vector's length), and a rank with ``assemble`` builds the step's
    fingerprint from all of them (rank 0; every launched rank, since each writes the run)."""

    def __init__(self, rank: int, world: int, config: GPTConfig, topology: Topology, batch_fn: BatchFn,
                 after_step: StateEdit | None, fingerprints: bool = False, assemble: bool = False) -> None:  # fmt: skip
        import torch

        self.rank, self.world, self.config, self.topology = rank, world, config, topology
        self.batch_fn, self.after_step, self.fingerprints = batch_fn, after_step, fingerprints
        self.assemble = fingerprints and assemble
        self.be = default_backend(config)
        self.layout = ExchangeLayout(config, topology.micro_batches if fingerprints else 0)
        self.send = torch.zeros(self.layout.size, dtype=torch.float32)
        self.recv = [torch.zeros(self.layout.size, dtype=torch.float32) for _ in range(world)]

    def step(self, state: TrainState, exchange: Callable[[], None]) -> tuple[TrainState, np.ndarray, StepReport,
                                                                           StepFingerprint | None]:
        """One step: this rank's term, the exchange (``exchange()`` runs the all-gather), the
        fixed-order reduction of all terms, the update; and on rank 0 of a run that records
        them and assembles them, the step's fingerprint (else None)."""
        be, k, before = self.be, state.step, state
        batch = self.batch_fn(k)
        check_batch(batch, self.config, self.topology)
        share = batch[self.rank]
        prints: list[int] = []

        def observe(rank: int, micro: int, loss, grads: dict) -> None:  # .fingerprint's _Recorder, per rank
            prints.append(f32_bits(be.download(loss)))

        term = rank_gradients(state, share, self.topology, be, rank=self.rank,
                              observe=observe if self.fingerprints else None)
        self.layout.pack({n: be.download(a) for n, a in term.items()}, share_digest(share), self.send.numpy(), prints)
        exchange()
        unpacked = [self.layout.unpack(v.numpy()) for v in self.recv]
        for r, (_, digest) in enumerate(unpacked):
            if digest != share_digest(batch[r]):
                raise DistributedError(
                    f"step {k}: rank {r} consumed another share than rank {self.rank}'s batch function gives it "
                    "(the batch function is not a pure function of the step)", rank=r,
                )  # fmt: skip
        terms = ({n: be.upload(a) for n, a in term.items()} for term, _ in unpacked)
        loss, grads = reduce_ranks(terms, be)
        state, report = finish_step(state, loss, grads, be)
        fingerprint = None
        if self.assemble:
            slots = [p for v in self.recv for p in self.layout.prints(v.numpy())]  # rank-major: the slot order
            fingerprint = StepFingerprint(before.step, tuple(slots), f32_bits(report.loss), f32_bits(report.grad_norm),
                                          f32_bits(report.clip_coef))
        if self.after_step is not None:
            state = self.after_step(state)
        return state, batch, report, fingerprint

    def all_gather(self) -> None:
        import torch.distributed as dist

        dist.all_gather(self.recv, self.send)


def _init_group(store, rank: int, world: int, exchange_timeout_s: float) -> None:
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", store=dist.PrefixStore(_STORE_PREFIX, store), rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=exchange_timeout_s),
    )  # fmt: skip


def _rank0(state0, batch_fn, topology, steps, world, after_step, timeouts, on_fingerprint
           ) -> Generator[Step, None, None]:  # fmt: skip
    import numba
    import torch.distributed as dist

    start_timeout_s, exchange_timeout_s = timeouts
    if dist.is_initialized():
        raise DistributedError("this process already has a torch.distributed process group; "
                               "a distributed run needs its own")  # fmt: skip
    config = state0.config
    threads = numba.get_num_threads()
    spawn = multiprocessing.get_context("spawn")
    workers: dict[int, multiprocessing.process.BaseProcess] = {}
    store, grouped = None, False
    handoff = tempfile.TemporaryDirectory(prefix="open1b-ranks-")  # mode 0700: ours alone
    try:
        numba.set_num_threads(_threads_per_rank(world))
        # Compile (or load) every kernel here first: the workers then load them from numba's cache
        # instead of compiling W times at once, and this process proves it computes the engine's bits.
        require_deterministic_machine(default_backend(config))
        store = dist.TCPStore(HOST, 0, world, is_master=True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=start_timeout_s))  # fmt: skip
        fingerprints = on_fingerprint is not None
        _write_handoff(Path(handoff.name), state0, topology, batch_fn, after_step, steps, timeouts, fingerprints)
        for rank in range(1, world):
            args = (rank, world, store.port, handoff.name, start_timeout_s)
            workers[rank] = spawn.Process(target=_worker_main, args=args, name=f"{WORKER_NAME}{rank}", daemon=True)
            workers[rank].start()
        _await_ready(store, workers, start_timeout_s)
        me = _Rank(0, world, config, topology, batch_fn, after_step, fingerprints, assemble=True)
        try:
            _init_group(store, 0, world, exchange_timeout_s)
            grouped = True
        except RuntimeError as exc:
            raise _blame(store, workers, "start-up", exc) from exc
        state = state0

        def exchange() -> None:
            try:
                me.all_gather()
            except RuntimeError as exc:
                raise _blame(store, workers, f"the exchange of step {state.step}", exc) from exc

        for _ in range(steps):
            state, batch, report, fingerprint = me.step(state, exchange)
            if fingerprint is not None:
                on_fingerprint(fingerprint)
            yield state, batch, report
        _await_exit(store, workers, exchange_timeout_s)
    finally:
        _stop(workers)
        if grouped:
            dist.destroy_process_group()
        numba.set_num_threads(threads)
        handoff.cleanup()
        store = None  # drop the last reference (the exchange closure shares this cell): closes the store's server


def _write_handoff(folder: Path, state0: TrainState, topology, batch_fn, after_step, steps, timeouts,
                   fingerprints: bool) -> None:  # fmt: skip
    # What the workers need, in files rather than in the spawn pipe: a payload larger than the
    # pipe's buffer blocks Process.start() until the child reads it, forever if the child dies
    # first (multiprocessing keeps the pipe's read end open while it writes). The state goes as
    # safetensors; only our own small objects (config, callables) are pickled.
    save_safetensors(dict(state0.tensors()), str(folder / _HANDOFF_STATE))
    run = {"config": state0.config, "step": state0.step, "topology": topology, "batch_fn": batch_fn,
           "after_step": after_step, "steps": steps, "timeouts": timeouts, "engine_source": SOURCE_DIGEST,
           "fingerprints": fingerprints}  # fmt: skip
    with open(folder / _HANDOFF_RUN, "wb") as f:
        pickle.dump(run, f)


def _read_handoff(folder: Path) -> tuple[dict, TrainState]:
    with open(folder / _HANDOFF_RUN, "rb") as f:
        run = pickle.load(f)  # written by rank 0 (our parent) into its private folder
    state = TrainState.from_tensors(load_safetensors(str(folder / _HANDOFF_STATE)), run["step"], run["config"])
    return run, state


def _await_ready(store, workers: dict, timeout_s: float) -> None:
    """Wait until every worker has set ``ready/<rank>``; raise at once if one fails or dies."""
    deadline = time.monotonic() + timeout_s
    pending = set(workers)
    while pending:
        pending = {r for r in pending if not store.check([f"ready/{r}"])}
        for r in sorted(pending):
            error = _report(store, r)
            if error is not None or workers[r].exitcode is not None:
                raise _blame(store, workers, "start-up", None)
        if pending and time.monotonic() > deadline:
            raise DistributedError(f"ranks {sorted(pending)} did not start within {timeout_s:g} s",
                                   rank=min(pending))  # fmt: skip
        time.sleep(0.05)


def _await_exit(store, workers: dict, timeout_s: float) -> None:
    """After the last exchange: every worker finishes its last update and exits cleanly."""
    deadline = time.monotonic() + timeout_s
    for r, p in workers.items():
        p.join(max(0.0, deadline - time.monotonic()))
        if p.exitcode != 0 or _report(store, r) is not None:
            raise _blame(store, workers, "the last update", None)


def _report(store, rank: int) -> bytes | None:
    key = f"error/{rank}"
    return store.get(key) if store.check([key]) else None


def _exit_words(code: int | None) -> str:
    if code is None:
        return "is still running"
    if code < 0:
        return f"was killed by signal {-code} ({signal.Signals(-code).name})"
    return f"exited with code {code}"


_START_HINT = (" (its traceback is on stderr; a script that starts a distributed run must guard its main code"
               " with `if __name__ == \"__main__\":`, since spawned workers import the main module)")


def _blame(store, workers: dict, during: str, cause: BaseException | None) -> DistributedError:
    """The error to raise after ``during`` failed: the first rank that reported its own failure,
    else the first that died without a report, else the ranks that went silent."""
    deadline = time.monotonic() + BLAME_GRACE_S
    while True:
        reports = {r: text for r in sorted(workers) if (text := _report(store, r)) is not None}
        for r, text in reports.items():
            kind, _, detail = text.partition(b"\n")
            if kind == _COMPUTE:
                detail_text = detail.decode("utf-8", "replace")
                last = detail_text.strip().splitlines()[-1] if detail_text.strip() else "no detail"
                return DistributedError(f"rank {r} failed during {during}: {last}", rank=r, detail=detail_text)
        for r, p in sorted(workers.items()):
            if r not in reports and p.exitcode not in (None, 0):
                hint = _START_HINT if during == "start-up" else ""
                return DistributedError(f"rank {r} {_exit_words(p.exitcode)} during {during}{hint}", rank=r)
        silent = [r for r, p in sorted(workers.items()) if r not in reports and p.exitcode is None]
        if time.monotonic() > deadline or not silent:
            break
        time.sleep(0.05)
    why = f": {cause}" if cause is not None else ""
    if silent and len(silent) < len(workers):
        return DistributedError(f"rank {silent[0]} stopped answering during {during}{why}", rank=silent[0])
    return DistributedError(f"{during} failed{why}")


def _stop(workers: dict) -> None:
    """End every worker still running: SIGTERM, then SIGKILL after :data:`STOP_GRACE_S`."""
    started = [p for p in workers.values() if p.pid is not None]
    for p in started:
        if p.is_alive():
            p.terminate()
    for p in started:
        p.join(STOP_GRACE_S)
        if p.is_alive():
            p.kill()
            p.join()


def _worker_main(rank: int, world: int, port: int, handoff: str, start_timeout_s: float) -> None:
    """Rank ``rank`` of a run, in its own spawned process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the caller's; rank 0 ends us with SIGTERM
    import numba
    import torch.distributed as dist

    store = dist.TCPStore(HOST, port, world, is_master=False, timeout=datetime.timedelta(seconds=start_timeout_s))
    kind = _COMPUTE
    try:
        run, state = _read_handoff(Path(handoff))
        if run["engine_source"] != SOURCE_DIGEST:
            # The engine's files changed between rank 0's start and ours: we would run other code.
            raise DistributedError(f"rank {rank} loaded other engine source files than rank 0 "
                                   f"({SOURCE_DIGEST} vs {run['engine_source']})", rank=rank)  # fmt: skip
        _, exchange_timeout_s = run["timeouts"]
        numba.set_num_threads(_threads_per_rank(world))
        me = _Rank(rank, world, run["config"], run["topology"], run["batch_fn"], run["after_step"], run["fingerprints"])
        require_deterministic_machine(me.be)
        steps = run["steps"]
        store.set(f"ready/{rank}", b"")
        kind = _EXCHANGE
        _init_group(store, rank, world, exchange_timeout_s)

        def exchange() -> None:
            nonlocal kind
            kind = _EXCHANGE
            me.all_gather()
            kind = _COMPUTE

        for _ in range(steps):
            kind = _COMPUTE
            state, *_ = me.step(state, exchange)
        dist.destroy_process_group()
    except BaseException:
        # Text only: rank 0 reads it back without unpickling anything.
        with contextlib.suppress(Exception):
            store.set(f"error/{rank}", kind + b"\n" + traceback.format_exc().encode("utf-8", "replace"))
        os._exit(1)
