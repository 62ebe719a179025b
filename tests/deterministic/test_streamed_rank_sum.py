"""Each rank's gradients added into the cross-rank sum as its backward makes them final
(deterministic/step.py ``step_gradients``): the same bits as summing whole rank terms, and one
whole gradient less alive at the peak."""

import dataclasses
import os
import tracemalloc

import numpy as np
import pytest

from open1b.deterministic import PRESETS, init_state
from open1b.deterministic.backend import default_backend
from open1b.deterministic.checkpoint_stream import (
    CheckpointWriter, FileMoments, StateSink, add_params_and_powers, file_state,
)  # fmt: skip
from open1b.deterministic.config import Topology
from open1b.deterministic.fingerprint import fingerprinted_step, fingerprinted_step_streamed
from open1b.deterministic import step as step_module
from open1b.deterministic.replay import replay
from open1b.deterministic.spill import SpillFile, held
from open1b.deterministic.step import step_gradients
from open1b.deterministic.trainer import publish_run
from open1b.protocol import Identity
from open1b.protocol.hashing import blake2b256

TOPOLOGIES = [(1, 1, 2), (2, 1, 1), (2, 3, 1), (3, 2, 2), (9, 1, 1)]  # 9 ranks: past one RANK_GROUP


def gradients(config, topology, *, whole: bool):
    """The step's loss and summed gradients; ``whole``: with an observer, which takes the path that
    sums whole rank terms."""
    state = init_state(config, seed=11)
    rng = np.random.default_rng(topology.ranks * 100 + topology.micro_batches)
    batch = rng.integers(0, config.vocab_size, (topology.ranks, topology.micro_batches, topology.micro_batch_size,
                                                config.seq_len + 1), dtype=np.int32)
    observe = (lambda rank, micro, loss, grads: None) if whole else None
    loss, grads = step_gradients(state, batch, topology, default_backend(config), observe)
    return np.asarray(loss).tobytes(), {n: np.asarray(g).tobytes() for n, g in grads.items()}


@pytest.mark.parametrize("ranks, micro_batches, rows", TOPOLOGIES)
def test_streamed_rank_sum_has_the_bits_of_whole_terms(ranks, micro_batches, rows):
    config = PRESETS["tiny"].config
    topology = Topology(ranks=ranks, micro_batches=micro_batches, micro_batch_size=rows)
    streamed, whole = gradients(config, topology, whole=False), gradients(config, topology, whole=True)
    assert streamed[0] == whole[0] and list(streamed[1]) == list(config.param_shapes())
    assert streamed[1] == whole[1]


def test_streamed_rank_sum_holds_one_gradient_less():
    """Peak memory of the step's gradients alone (numpy reports its arrays to tracemalloc), the
    state made before: summing whole terms holds rank 0's sum and all of rank 1's gradients (two
    gradients); streaming holds the sum and one block's gradients (six blocks here)."""
    config = dataclasses.replace(PRESETS["small"].config, n_layers=6, seq_len=16)
    topology = Topology(ranks=2, micro_batches=1, micro_batch_size=1)
    state, be = init_state(config, seed=1), default_backend(config)
    batch = np.random.default_rng(0).integers(0, config.vocab_size, (2, 1, 1, config.seq_len + 1), dtype=np.int32)
    step_gradients(state, batch, topology, be)  # kernels loaded outside the measurement
    peaks, bits = {}, {}
    for whole in (False, True):
        tracemalloc.start()
        try:
            loss, grads = step_gradients(state, batch, topology, be, (lambda *a: None) if whole else None)
            peaks[whole] = tracemalloc.get_traced_memory()[1] / (4 * config.n_params())
        finally:
            tracemalloc.stop()
        bits[whole] = (loss.tobytes(), [g.tobytes() for g in grads.values()])
    assert bits[False] == bits[True]
    assert peaks[True] > 1.9 and peaks[False] < 1.4, peaks  # in gradients' bytes


def spilled_gradients(config, topology, tmp_path):
    """:func:`gradients`' step through the spilling path (``spill``): its bits, and the parameters
    the state still holds afterwards."""
    state = init_state(config, seed=11)
    rng = np.random.default_rng(topology.ranks * 100 + topology.micro_batches)
    batch = rng.integers(0, config.vocab_size, (topology.ranks, topology.micro_batches, topology.micro_batch_size,
                                                config.seq_len + 1), dtype=np.int32)
    with SpillFile(tmp_path) as spill:
        loss, grads = step_gradients(state, batch, topology, default_backend(config), spill=spill)
    return (np.asarray(loss).tobytes(), {n: np.asarray(g).tobytes() for n, g in grads.items()}), state.params


@pytest.mark.parametrize("ranks, micro_batches, rows", TOPOLOGIES)
def test_spilled_sums_and_released_parameters_keep_the_bits(ranks, micro_batches, rows, tmp_path):
    config = PRESETS["tiny"].config
    topology = Topology(ranks=ranks, micro_batches=micro_batches, micro_batch_size=rows)
    spilled, left = spilled_gradients(config, topology, tmp_path)
    assert spilled == gradients(config, topology, whole=True)
    assert left == {}  # the last backward let go of every parameter


@pytest.mark.parametrize("ranks, micro_batches", [(2, 1), (1, 3), (2, 2)])
def test_spilling_holds_the_parameters_or_the_gradient_sum_never_both(ranks, micro_batches, tmp_path):
    """Peak memory of the parameters and the step's gradients (numpy reports its arrays to
    tracemalloc; the parameters are copied inside the measurement, so their release counts):
    without ``spill`` both are whole at the end of the last backward (about twice the
    parameters' bytes; more where a rank folds whole micro-batches); with it, the earlier ranks'
    sums and a rank's fold of its earlier micro-batches wait on disk and each parameter goes as
    its gradient comes (about once)."""
    config = dataclasses.replace(PRESETS["small"].config, n_layers=6, seq_len=16)
    topology = Topology(ranks=ranks, micro_batches=micro_batches, micro_batch_size=1)
    state, be = init_state(config, seed=1), default_backend(config)
    batch = np.random.default_rng(0).integers(0, config.vocab_size, (ranks, micro_batches, 1, config.seq_len + 1),
                                              dtype=np.int32)  # fmt: skip
    step_gradients(state, batch, topology, be)  # kernels loaded outside the measurement
    peaks, bits = {}, {}
    for spilling in (False, True):
        tracemalloc.start()
        try:
            copy = dataclasses.replace(state, params={n: a.copy() for n, a in state.params.items()})
            with SpillFile(tmp_path) as spill:
                loss, grads = step_gradients(copy, batch, topology, be, spill=spill if spilling else None)
            peaks[spilling] = tracemalloc.get_traced_memory()[1] / (4 * config.n_params())
            del copy
        finally:
            tracemalloc.stop()
        bits[spilling] = (loss.tobytes(), [g.tobytes() for g in grads.values()])
    assert bits[False] == bits[True]
    assert peaks[False] > 1.9 and peaks[True] < 1.4, peaks  # in parameters' bytes


def test_a_spill_file_gives_back_what_was_put_once_and_reuses_its_place(tmp_path):
    rng = np.random.default_rng(3)
    a, b = rand_f32(rng, 5, 7), rand_f32(rng, 5, 7)
    with SpillFile(tmp_path) as spill:
        parked = spill.put(a)
        assert held(parked).tobytes() == a.tobytes()
        with pytest.raises(ValueError):
            parked.take()  # each parked array is read back once
        again = spill.put(b)
        assert again.offset == parked.offset  # the taken array's place
        assert again.take().tobytes() == b.tobytes()


def rand_f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_the_spill_file_has_no_name_in_its_directory_so_no_exit_leaves_it_behind(tmp_path):
    """The file lies in the directory it is given (not the system's temporary directory, often a
    tmpfs) but has no entry there: a kill leaves nothing; an error inside closes it."""
    with pytest.raises(RuntimeError), SpillFile(tmp_path) as spill:
        spill.put(np.ones(4, np.float32))
        where = os.readlink(f"/proc/self/fd/{spill._fd}")
        assert where.startswith(str(tmp_path)) and os.listdir(tmp_path) == []
        raise RuntimeError("a step that fails")
    assert spill._file.closed and os.listdir(tmp_path) == []


@pytest.mark.parametrize("given", [False, True])
def test_a_replay_spills_beside_its_run_or_where_it_is_told(given, tmp_path, monkeypatch):
    assert PRESETS["tiny"].topology.ranks > 1  # rank 0's sums are spilled
    run_dir = tmp_path / "run"
    manifest = publish_run(run_dir, Identity(blake2b256(b"tests/spill")), steps=1, seed=2, fingerprints=False)
    used = []

    class Recorded(SpillFile):
        def __init__(self, directory):
            used.append(directory)
            super().__init__(directory)

    monkeypatch.setattr(step_module, "SpillFile", Recorded)
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir()
    result = replay(run_dir, 0, manifest, spill_dir=spill_dir if given else None)
    assert result.match
    assert used == [spill_dir if given else run_dir]


def _written_state(state, path):
    """``state`` as the trainer holds it after writing its checkpoint: the parameters in memory
    (copies), the moments in the file; and the parameters' read-back from that file."""
    config = state.config
    out = CheckpointWriter(path, config, state.step)
    sink = StateSink(config, out)
    for name in config.param_shapes():
        sink.add(f"adam_m/{name}", state.m[name])
        sink.add(f"adam_v/{name}", state.v[name])
    add_params_and_powers(sink, state.params, state.beta1_pow, state.beta2_pow)
    out.finish()
    params = {n: a.copy() for n, a in state.params.items()}
    return (file_state(config, state.step, path, out.slots, sink.digests, params),
            FileMoments(path, "param", out.slots, sink.digests, list(config.param_shapes())))


def test_the_trainers_fingerprinted_step_spills_and_releases_as_a_replay_does(tmp_path):
    """The trainer's step (fingerprints recorded, parameters read back from the checkpoint it
    starts from) has fingerprinted_step's bits, and its peak of parameters and gradients
    (tracemalloc, the parameters copied inside the measurement) is about one parameters' bytes,
    where the same step without the read-back holds the parameters, the earlier ranks' sum and a
    rank's fold whole (as the trainer did before, its fingerprint's observer seeing whole gradients)."""
    config = dataclasses.replace(PRESETS["small"].config, n_layers=6, seq_len=16)
    topology = Topology(ranks=2, micro_batches=2, micro_batch_size=1)
    state, be = init_state(config, seed=1), default_backend(config)
    batch = np.random.default_rng(0).integers(0, config.vocab_size, (2, 2, 1, config.seq_len + 1), dtype=np.int32)
    whole_state, report, fingerprint = fingerprinted_step(state, batch, topology, backend=be)
    peaks, moments = {}, []

    def sink(name, a):  # each new moment compared as it comes, not kept (the trainer writes them)
        group = whole_state.m if name.startswith("adam_m/") else whole_state.v
        moments.append(np.array_equal(a.view(np.uint32), group[name.split("/", 1)[1]].view(np.uint32)))

    for reading_back in (False, True):
        moments.clear()
        tracemalloc.start()
        try:
            streamed, reread = _written_state(state, tmp_path / f"c{int(reading_back)}")
            params, got, *_, fp = fingerprinted_step_streamed(
                streamed, batch, topology, sink, backend=be,
                reread=reread if reading_back else None, spill_dir=tmp_path)
            peaks[reading_back] = tracemalloc.get_traced_memory()[1] / (4 * config.n_params())
        finally:
            tracemalloc.stop()
        assert fp == fingerprint and got == report
        assert {n: a.tobytes() for n, a in params.items()} == {n: a.tobytes() for n, a in whole_state.params.items()}
        assert len(moments) == 2 * len(config.param_shapes()) and all(moments)
        del params, streamed, reread
    assert peaks[False] > 2.5 and peaks[True] < 1.6, peaks  # in parameters' bytes (3.25 and 1.44 when written)
