"""Fingerprints and spot checks: the fingerprinted step is train_step bit for bit; an honest step
passes every link; each forgery of docs/run-format.md §10.3 is caught by the link the spec names."""

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from open1b.deterministic import PRESETS, batch_for_step, builtin_dataset, init_state, train_step
from open1b.deterministic.fingerprint import (
    CHUNK_ELEMENTS, Caught, _Gradient, answer_challenge, check_chunks, check_loss_sum, chunk, chunk_count,
    fingerprinted_step, flat_gradient, recompute_slot,
)  # fmt: skip
from open1b.deterministic.backend import cpu_backend
from open1b.deterministic.selfcheck import state_fingerprint
from open1b.protocol.hashing import blake2b256

CONFIG, TOPOLOGY = PRESETS["tiny"].config, PRESETS["tiny"].topology
SEED = 5
SLOTS = range(TOPOLOGY.ranks * TOPOLOGY.micro_batches)


@pytest.fixture(scope="module")
def step1():
    """State 1 (non-zero moments), the batch of step 1, state 2 and step 1's fingerprint."""
    data = builtin_dataset(CONFIG)
    s0 = init_state(CONFIG, SEED)
    s1, _ = train_step(s0, batch_for_step(data, SEED, 0, CONFIG, TOPOLOGY), TOPOLOGY)
    batch = batch_for_step(data, SEED, 1, CONFIG, TOPOLOGY)
    s2, _, fp = fingerprinted_step(s1, batch, TOPOLOGY)
    return s1, batch, s2, fp, data


def test_fingerprinted_step_is_train_step_bit_for_bit(step1):
    s1, batch, s2, fp, _ = step1
    plain, report = train_step(s1, batch, TOPOLOGY)
    assert state_fingerprint(plain) == state_fingerprint(s2)
    assert fp.step == 1 and len(fp.losses) == len(SLOTS) and len(set(fp.losses)) == len(SLOTS)
    assert fp.loss == int(np.float32(report.loss).view(np.uint32))
    assert fp.grad_norm == int(np.float32(report.grad_norm).view(np.uint32))
    assert fp.clip_coef == int(np.float32(report.clip_coef).view(np.uint32))
    again = fingerprinted_step(s1, batch, TOPOLOGY)[2]
    assert again == fp and again.commitment == fp.commitment


# The committed bits of step 1 of `tiny` (seed 5): F_1 and a digest of a three-chunk answer. The
# engine's bits are the same on every backend, so these change only if the fingerprint's format
# (or the engine) changes: any speed-up of the recording must leave them as they are.
PINNED_COMMITMENT = "19cd8599431a5ed8d0f5e403970870b4c3a180e1a948170c3cef8751b82dd1e8"
PINNED_ANSWER = "299053f301d19dbce4bede2fe5268976f59b4e1d324e13b610bf17fd66ea248c"


def test_fingerprint_and_answer_bits_are_pinned(step1):
    s1, batch, _, fp, _ = step1
    assert fp.commitment.hex() == PINNED_COMMITMENT
    answer = answer_challenge(s1, batch, TOPOLOGY, (0, 3, chunk_count(CONFIG) - 1))
    parts = [a.tobytes() for op in answer for a in (*op.micro, op.summed)]
    assert blake2b256(*parts).hex() == PINNED_ANSWER


def test_chunks_read_from_the_tensors_are_the_flat_vectors_chunks():
    """Chunks that straddle tensors, a tensor spanning several chunks, one ending on a chunk
    boundary, an empty one and a short last chunk: the same bytes as the flat vector's chunks
    (the definition, docs/run-format.md §10.1)."""
    n = CHUNK_ELEMENTS
    shapes = {"a": (3, 1000), "b": (2 * n + 17,), "empty": (0, 4), "c": (n - 3017,), "d": (5, 7, 11), "e": (n,)}
    rng = np.random.default_rng(1)
    grads = {k: rng.standard_normal(s, dtype=np.float32) for k, s in reversed(shapes.items())}  # dict order ≠ canonical
    config, be = SimpleNamespace(param_shapes=lambda: shapes), cpu_backend(False)
    flat, views = flat_gradient(grads, config, be), _Gradient(grads, config, be)
    assert flat.shape[0] % n and -(-flat.shape[0] // n) == 5
    assert all(views.chunk(c).tobytes() == chunk(flat, c).tobytes() for c in range(5))
    assert chunk(flat, 4).shape[0] == flat.shape[0] - 4 * n  # the last chunk is shorter


def _summed(state, batch) -> dict:
    """The summed, pre-clip gradient of the step from ``state`` on ``batch`` (what the update consumes)."""
    from open1b.deterministic.step import step_gradients
    return step_gradients(state, batch, TOPOLOGY, cpu_backend(False))[1]


def _check(fp, s1, batch, after, answered_from, slot, chunks) -> Caught:
    """Every link of one challenge, in §10.2's order: the verifier recomputes ``slot`` on the
    committed ``batch``; the trainer answers ``chunks`` from the batch it trained on."""
    caught, mine = recompute_slot(fp, s1, batch, TOPOLOGY, slot, chunks)
    if caught is Caught.NONE:
        caught = check_loss_sum(fp, CONFIG, TOPOLOGY)
    if caught is not Caught.NONE:
        return caught
    return check_chunks(fp, answer_challenge(s1, answered_from, TOPOLOGY, chunks), slot, mine, s1, after, TOPOLOGY)


def test_an_honest_step_passes_every_link(step1):
    s1, batch, s2, fp, _ = step1
    chunks = (0, chunk_count(CONFIG) // 2, chunk_count(CONFIG) - 1)  # the last chunk is shorter
    assert CONFIG.n_params() % CHUNK_ELEMENTS != 0
    assert [_check(fp, s1, batch, s2, batch, slot, chunks) for slot in SLOTS] == [Caught.NONE] * len(SLOTS)


def test_the_recomputed_slot_chunks_are_the_micro_batch_gradients_chunks(step1):
    s1, batch, _, fp, _ = step1
    chunks = (1, chunk_count(CONFIG) - 1)
    answer = answer_challenge(s1, batch, TOPOLOGY, chunks)
    for slot in SLOTS:
        _, mine = recompute_slot(fp, s1, batch, TOPOLOGY, slot, chunks)
        assert [m.tobytes() for m in mine] == [op.micro[slot].tobytes() for op in answer]
    assert answer[0].micro[0].tobytes() != answer[0].micro[1].tobytes()
    assert answer[0].summed.tobytes() == chunk(flat_gradient(_summed(s1, batch), CONFIG, cpu_backend(False)), 1).tobytes()


def test_substituted_data_is_caught_by_every_micro_batch(step1):
    """The trainer commits batch 1 but trains (and fingerprints) on other text."""
    s1, batch, _, _, data = step1
    other = batch_for_step(data, SEED + 1, 1, CONFIG, TOPOLOGY)
    forged = fingerprinted_step(s1, other, TOPOLOGY)[2]
    assert [recompute_slot(forged, s1, batch, TOPOLOGY, slot, (0,))[0] for slot in SLOTS] == [Caught.LOSS] * len(SLOTS)


def test_forged_micro_batch_gradient_is_caught_at_its_secret_slot_only(step1):
    """Slot 2 trained on other text, every commitment consistent with it but its loss, which the
    trainer reports as the honest one (and the honest total): only a verifier whose secret slot is
    2 catches it, by comparing its recomputation with the answered chunks."""
    s1, batch, _, honest, data = step1
    one_forged = batch.copy()
    one_forged[1, 0] = batch_for_step(data, SEED + 1, 1, CONFIG, TOPOLOGY)[1, 0]
    after, _, fp = fingerprinted_step(s1, one_forged, TOPOLOGY)
    fp = replace(fp, losses=honest.losses, loss=honest.loss)
    chunks = (0, chunk_count(CONFIG) - 1)
    assert [_check(fp, s1, batch, after, one_forged, slot, chunks) for slot in SLOTS] == [
        Caught.NONE, Caught.NONE, Caught.GRADIENT, Caught.NONE]


def test_altered_loss_is_caught_by_the_loss_sum(step1):
    _, _, _, fp, _ = step1
    assert check_loss_sum(replace(fp, loss=fp.loss ^ 1), CONFIG, TOPOLOGY) is Caught.LOSS_SUM


def test_skipped_update_is_caught_on_any_chunk(step1):
    s1, batch, _, fp, _ = step1
    skipped = replace(s1, step=2)
    for c in (0, chunk_count(CONFIG) - 1):
        assert _check(fp, s1, batch, skipped, batch, 0, (c,)) is Caught.UPDATE


def test_answered_micro_chunks_that_do_not_sum_are_caught(step1):
    """An answerer moves a chunk's mass from one slot to another: the slot it did not touch in the
    verifier's secret slot's place sees the sum break, the slots it touched their own gradient."""
    s1, batch, s2, fp, _ = step1
    (op,) = answer_challenge(s1, batch, TOPOLOGY, (0,))
    micro = list(op.micro)
    micro[3] = micro[3] + np.float32(1)
    moved = (replace(op, micro=tuple(micro)),)
    mine = {slot: recompute_slot(fp, s1, batch, TOPOLOGY, slot, (0,))[1] for slot in SLOTS}
    assert [check_chunks(fp, moved, slot, mine[slot], s1, s2, TOPOLOGY) for slot in SLOTS] == [
        Caught.SUM, Caught.SUM, Caught.SUM, Caught.GRADIENT]


def test_a_summed_chunk_other_than_the_steps_breaks_the_update(step1):
    """No commitment holds the summed gradient: checkpoint k+1 does, through AdamW, so one changed
    element of an answered summed chunk is an update failure."""
    s1, batch, s2, fp, _ = step1
    (op,) = answer_challenge(s1, batch, TOPOLOGY, (0,))
    summed = op.summed.copy()
    summed[3] = summed[3] * np.float32(2)
    _, mine = recompute_slot(fp, s1, batch, TOPOLOGY, 0, (0,))
    assert check_chunks(fp, (replace(op, summed=summed),), 0, mine, s1, s2, TOPOLOGY) is Caught.UPDATE


def test_malformed_answers_are_proof_failures(step1):
    s1, batch, s2, fp, _ = step1
    (op,) = answer_challenge(s1, batch, TOPOLOGY, (0,))
    _, mine = recompute_slot(fp, s1, batch, TOPOLOGY, 0, (0,))
    bad = [replace(op, index=chunk_count(CONFIG)), replace(op, micro=op.micro[:-1]),
           replace(op, summed=op.summed.astype(np.float64)), replace(op, summed=op.summed[:-1])]
    assert [check_chunks(fp, (b,), 0, mine, s1, s2, TOPOLOGY) for b in bad] == [Caught.PROOF] * len(bad)
