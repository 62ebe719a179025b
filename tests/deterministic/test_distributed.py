"""The data-parallel trainer: a 4-rank gloo run equals a one-process replay of each of its steps,
bit for bit; failing, dying, silent and interrupted ranks end the run with a typed error and
leave no process behind.

Every run here spawns real worker processes (each imports torch and loads the kernels), so the
runs are few, short and small: the tiny preset, a few steps, 2–4 ranks.
"""

import dataclasses
import functools
import multiprocessing
import os
import signal
import time

import numpy as np
import pytest
import torch.distributed as dist

from open1b.deterministic import PRESETS, Topology, init_state, train_step
from open1b.deterministic.backend import default_backend
from open1b.deterministic.data import batch_for_step, builtin_dataset
from open1b.deterministic.distributed import (
    WORKER_NAME, ExchangeLayout, distributed_steps, local_steps, run_steps, share_digest,
)  # fmt: skip
from open1b.deterministic.errors import ConfigError, DistributedError
from open1b.deterministic.runfile import next_state_hash
from open1b.deterministic.selfcheck import state_fingerprint
from open1b.deterministic.step import finish_step, rank_gradients, reduce_ranks

CONFIG = PRESETS["tiny"].config
SEED = 5
START = bytes(32)  # the chain's prev for h_0: any fixed value, the same for both chains


def topology(ranks: int) -> Topology:
    return dataclasses.replace(PRESETS["tiny"].topology, ranks=ranks)


def batches(ranks: int):
    """The run's own schedule (a pure function of the step), picklable for the workers."""
    return functools.partial(batch_for_step, builtin_dataset(CONFIG), SEED, config=CONFIG, topology=topology(ranks))


def hash_chain(state0, steps) -> list[bytes]:
    """h_0 … h_S over (state after step k, batch of step k): every tensor's bytes, the step, the batch."""
    hashes = [next_state_hash(START, state0, None)]
    for state, batch, _ in steps:
        hashes.append(next_state_hash(hashes[-1], state, batch))
    return hashes


def in_rank(rank: int) -> bool:
    return multiprocessing.current_process().name == f"{WORKER_NAME}{rank}"


def assert_clean() -> None:
    """No worker left running and no process group left behind in this process."""
    assert [p.name for p in multiprocessing.active_children() if p.name.startswith(WORKER_NAME)] == []
    assert not dist.is_initialized()


def test_four_gloo_ranks_equal_a_one_process_replay_of_every_step():
    state0, fn = init_state(CONFIG, SEED), batches(4)
    run = list(distributed_steps(state0, fn, topology(4), 3, world=4))
    assert_clean()
    assert [s.step for s, _, _ in run] == [1, 2, 3]
    # Replay each step alone, in this process, from the distributed run's own state before it.
    before = [state0] + [s for s, _, _ in run[:-1]]
    replayed = []
    for prev, (_, batch, _) in zip(before, run):
        assert np.array_equal(batch, fn(prev.step))  # rank 0 yields the schedule's batch
        state, report = train_step(prev, batch, topology(4))
        replayed.append((state, batch, report))
    assert hash_chain(state0, run) == hash_chain(state0, replayed)
    assert [r for _, _, r in run] == [r for _, _, r in replayed]  # loss, norm, clip and witness bits
    # The same run straight through the one-process loop, and through the trainer's dispatcher.
    assert hash_chain(state0, local_steps(state0, fn, topology(4), 3)) == hash_chain(state0, run)
    assert hash_chain(state0, run_steps(state0, fn, topology(4), 3, world=1)) == hash_chain(state0, run)


def test_the_step_pieces_compose_to_train_step_in_rank_order_only():
    # What each rank runs: its own term, the fixed-order reduction of all terms, the update.
    # Reducing the same terms in another order gives other bits, so the order is what matters.
    state, batch, be = init_state(CONFIG, SEED), batches(4)(0), default_backend(CONFIG)
    terms = [rank_gradients(state, batch[r], topology(4), be) for r in range(4)]
    expected, expected_report = train_step(state, batch, topology(4))
    composed, report = finish_step(state, *reduce_ranks((dict(t) for t in terms), be), be)  # it empties its terms
    assert state_fingerprint(composed) == state_fingerprint(expected) and report == expected_report
    reordered, _ = finish_step(state, *reduce_ranks((dict(t) for t in reversed(terms)), be), be)
    assert state_fingerprint(reordered) != state_fingerprint(expected)


def test_exchange_vector_round_trips_every_bit():
    layout = ExchangeLayout(CONFIG)
    rng = np.random.default_rng(0)
    term = {n: rng.standard_normal(s).astype(np.float32) for n, s in CONFIG.param_shapes().items()}
    term["loss"] = np.array([-0.0], np.float32)
    odd = np.array([0x7FC00001, 0x00000001], np.uint32).view(np.float32)  # a NaN payload, a subnormal
    term["wte"].reshape(-1)[:2] = odd
    digest = share_digest(batches(2)(0)[1])
    vector = np.empty(layout.size, np.float32)
    layout.pack(term, digest, vector)
    back, got = layout.unpack(vector)
    assert got == digest and back.keys() == term.keys()
    assert all(back[n].tobytes() == term[n].tobytes() and back[n].shape == term[n].shape for n in term)


def test_arguments_are_refused_before_any_process_starts():
    state0 = init_state(CONFIG, SEED)
    with pytest.raises(ConfigError, match="world 3 does not match the topology's 4 ranks"):
        distributed_steps(state0, batches(4), topology(4), 2, world=3)
    with pytest.raises(ConfigError, match="batch_fn must be picklable"):
        distributed_steps(state0, lambda k: batches(2)(k), topology(2), 2, world=2)
    with pytest.raises(ConfigError, match="world must be a positive int"):
        distributed_steps(state0, batches(2), topology(2), 2, world=0)
    assert_clean()


def _fail_in_rank(rank: int, step: int, fn, k: int) -> np.ndarray:
    if in_rank(rank) and k == step:
        raise RuntimeError(f"injected failure in rank {rank}")
    return fn(k)


def test_a_failing_rank_surfaces_as_a_typed_error_naming_it():
    fn = functools.partial(_fail_in_rank, 2, 1, batches(3))
    steps = distributed_steps(init_state(CONFIG, SEED), fn, topology(3), 3, world=3)
    assert next(steps)[0].step == 1
    with pytest.raises(DistributedError, match="rank 2 failed during the exchange of step 1") as caught:
        next(steps)
    assert caught.value.rank == 2
    assert "injected failure in rank 2" in str(caught.value) and "_fail_in_rank" in caught.value.detail
    assert_clean()


def _kill_rank(rank: int, step: int, fn, k: int) -> np.ndarray:
    if in_rank(rank) and k == step:
        os.kill(os.getpid(), signal.SIGKILL)
    return fn(k)


def test_a_killed_rank_is_named_with_its_signal():
    fn = functools.partial(_kill_rank, 1, 1, batches(2))
    with pytest.raises(DistributedError, match="rank 1 was killed by signal 9") as caught:
        list(distributed_steps(init_state(CONFIG, SEED), fn, topology(2), 3, world=2))
    assert caught.value.rank == 1
    assert_clean()


def _hang_rank(rank: int, step: int, fn, k: int) -> np.ndarray:
    if in_rank(rank) and k == step:
        time.sleep(3600)
    return fn(k)


def test_a_silent_rank_times_out_instead_of_hanging():
    fn = functools.partial(_hang_rank, 2, 1, batches(3))
    started = time.monotonic()
    with pytest.raises(DistributedError, match="rank 2 stopped answering during the exchange of step 1") as caught:
        list(distributed_steps(init_state(CONFIG, SEED), fn, topology(3), 3, world=3, exchange_timeout_s=3))
    assert caught.value.rank == 2
    assert_clean()  # the sleeping worker was terminated, not waited for
    assert time.monotonic() - started < 120


def _other_data_in_workers(fn, k: int) -> np.ndarray:
    batch = fn(k)
    return batch if multiprocessing.current_process().name == "MainProcess" else (batch + 1) % CONFIG.vocab_size


def test_ranks_that_consumed_other_data_are_caught():
    # The state hash commits to the batch rank 0 yields; the exchange carries a digest of each
    # rank's share, so a batch function that is not pure cannot make that commitment false.
    fn = functools.partial(_other_data_in_workers, batches(2))
    with pytest.raises(DistributedError, match="rank 1 consumed another share") as caught:
        list(distributed_steps(init_state(CONFIG, SEED), fn, topology(2), 2, world=2))
    assert caught.value.rank == 1
    assert_clean()


def test_publish_run_with_two_processes_publishes_the_one_process_run(tmp_path):
    # The tiny preset's topology has 2 ranks: ranks=2 trains it on two gloo processes, the
    # default computes both ranks here. Same chain, checkpoints and witnesses, forgery included
    # (tamper_step runs as an after-step hook on every rank).
    from open1b.deterministic.trainer import publish_run
    from open1b.protocol import Identity, blake2b256

    assert PRESETS["tiny"].topology.ranks == 2
    identity = Identity(blake2b256(b"trainer"))
    one = publish_run(tmp_path / "one", identity, steps=2, seed=SEED, tamper_step=0)
    two = publish_run(tmp_path / "two", identity, steps=2, seed=SEED, tamper_step=0, ranks=2)
    assert_clean()
    for field in ("model", "state_hashes", "witnesses", "samples_root"):
        assert getattr(one, field) == getattr(two, field), field
    # Not the checkpoints' blob addresses: safetensors writes its metadata map in an order that
    # changes from process to process, so equal states may get different file bytes. The state
    # hashes above cover every tensor's bytes.


def _interrupt_main(state):
    if multiprocessing.current_process().name == "MainProcess":
        raise KeyboardInterrupt  # as if Ctrl-C arrived while rank 0 computes
    return state


def test_keyboard_interrupt_ends_every_worker():
    with pytest.raises(KeyboardInterrupt):
        list(distributed_steps(init_state(CONFIG, SEED), batches(2), topology(2), 3, world=2,
                               after_step=_interrupt_main))
    assert_clean()
