"""Fingerprints and spot checks: the fingerprinted step is train_step bit for bit; an honest step
passes every link; each forgery of docs/run-format.md §10.3 is caught by the link the spec names."""

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from open1b.deterministic import PRESETS, batch_for_step, builtin_dataset, init_state, train_step
from open1b.deterministic.fingerprint import (
    CHUNK_ELEMENTS, Caught, answer_challenge, check_chunks, check_loss_sum, check_micro, chunk_count,
    chunk_tree, fingerprinted_step, flat_gradient, gradient_tree,
)  # fmt: skip
from open1b.deterministic.backend import cpu_backend
from open1b.deterministic.selfcheck import state_fingerprint
from open1b.protocol.hashing import blake2b256

CONFIG, TOPOLOGY = PRESETS["tiny"].config, PRESETS["tiny"].topology
SEED = 5
SLOTS = [(r, m) for r in range(TOPOLOGY.ranks) for m in range(TOPOLOGY.micro_batches)]


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
    assert fp.step == 1 and len(fp.losses) == len(fp.grad_roots) == len(SLOTS)
    assert fp.loss == int(np.float32(report.loss).view(np.uint32))
    assert len(set(fp.grad_roots)) == len(SLOTS)  # each micro-batch has its own gradient
    again = fingerprinted_step(s1, batch, TOPOLOGY)[2]
    assert again == fp and again.commitment == fp.commitment


# The committed bits of step 1 of `tiny` (seed 5): F_1 and a digest of a three-chunk answer. The
# engine's bits are the same on every backend, so these change only if the fingerprint's format
# (or the engine) changes: any speed-up of the recording must leave them as they are.
PINNED_COMMITMENT = "aa5b6d54f37388c472dcca7c101ffa5e03a768cc12833a9a8a200fe60e422713"
PINNED_ANSWER = "b4a16f18648d9a7fb069aaf8d766d016b9b2103b90bf46e63e5a5c5dd4c1c5fb"


def test_fingerprint_and_answer_bits_are_pinned(step1):
    s1, batch, _, fp, _ = step1
    assert fp.commitment.hex() == PINNED_COMMITMENT
    answer = answer_challenge(s1, batch, TOPOLOGY, (0, 3, chunk_count(CONFIG) - 1))
    parts = [b for op in answer for b in (*(a.tobytes() for a in (*op.micro, op.summed)),
                                          *(p for proof in op.micro_proofs for p in proof), *op.summed_proof)]
    assert blake2b256(*parts).hex() == PINNED_ANSWER


def test_chunks_hashed_from_the_tensors_are_the_flat_vectors_chunks():
    """Chunks that straddle tensors, a tensor spanning several chunks, one ending on a chunk
    boundary, an empty one and a short last chunk: the same leaves, root and proofs as the
    flat vector's tree (the definition, docs/run-format.md §10.1)."""
    n = CHUNK_ELEMENTS
    shapes = {"a": (3, 1000), "b": (2 * n + 17,), "empty": (0, 4), "c": (n - 3017,), "d": (5, 7, 11), "e": (n,)}
    rng = np.random.default_rng(1)
    grads = {k: rng.standard_normal(s, dtype=np.float32) for k, s in reversed(shapes.items())}  # dict order ≠ canonical
    config, be = SimpleNamespace(param_shapes=lambda: shapes), cpu_backend(False)
    flat = flat_gradient(grads, config, be)
    want, got = chunk_tree(flat), gradient_tree(grads, config, be)
    assert flat.shape[0] % n and got.levels == want.levels and got.size == 5
    assert all(got.proof(c) == want.proof(c) for c in range(got.size))
    assert chunk_tree(flat[::-1].copy()).root != got.root  # the order of the elements counts


def test_an_honest_step_passes_every_link(step1):
    s1, batch, s2, fp, _ = step1
    assert all(check_micro(fp, s1, batch, TOPOLOGY, r, m) is Caught.NONE for r, m in SLOTS)
    assert check_loss_sum(fp, CONFIG, TOPOLOGY) is Caught.NONE
    chunks = (0, chunk_count(CONFIG) // 2, chunk_count(CONFIG) - 1)  # the last chunk is shorter
    assert CONFIG.n_params() % CHUNK_ELEMENTS != 0
    assert check_chunks(fp, answer_challenge(s1, batch, TOPOLOGY, chunks), s1, s2, TOPOLOGY) is Caught.NONE


def test_substituted_data_is_caught_by_every_micro_batch(step1):
    """The trainer commits batch 1 but trains (and fingerprints) on other text."""
    s1, batch, _, _, data = step1
    other = batch_for_step(data, SEED + 1, 1, CONFIG, TOPOLOGY)
    forged = fingerprinted_step(s1, other, TOPOLOGY)[2]
    assert [check_micro(forged, s1, batch, TOPOLOGY, r, m) for r, m in SLOTS] == [Caught.LOSS] * len(SLOTS)


def test_forged_micro_batch_gradient_is_caught_at_its_slot_only(step1):
    s1, batch, _, fp, _ = step1
    roots = list(fp.grad_roots)
    roots[1] = bytes(32)
    forged = replace(fp, grad_roots=tuple(roots))
    assert [check_micro(forged, s1, batch, TOPOLOGY, r, m) for r, m in SLOTS] == [
        Caught.NONE, Caught.GRADIENT, Caught.NONE, Caught.NONE]


def test_altered_loss_is_caught_by_the_loss_sum(step1):
    _, _, _, fp, _ = step1
    assert check_loss_sum(replace(fp, loss=fp.loss ^ 1), CONFIG, TOPOLOGY) is Caught.LOSS_SUM


def test_skipped_update_is_caught_on_any_chunk(step1):
    s1, batch, _, fp, _ = step1
    skipped = replace(s1, step=2)
    for c in (0, chunk_count(CONFIG) - 1):
        assert check_chunks(fp, answer_challenge(s1, batch, TOPOLOGY, (c,)), s1, skipped, TOPOLOGY) is Caught.UPDATE


def test_a_summed_gradient_that_is_not_the_sum_is_caught(step1):
    """A trainer commits honest micro-batch roots but the root of another sum, and opens it."""
    s1, batch, s2, fp, _ = step1
    openings = answer_challenge(s1, batch, TOPOLOGY, tuple(range(chunk_count(CONFIG))))
    summed = np.concatenate([op.summed for op in openings])
    summed[3] = np.float32(summed[3]) * np.float32(2)
    tree = chunk_tree(summed)
    forged = replace(fp, sum_root=tree.root)
    op = replace(openings[0], summed=summed[:CHUNK_ELEMENTS], summed_proof=tuple(tree.proof(0)))
    assert check_chunks(forged, (op,), s1, s2, TOPOLOGY) is Caught.SUM
    # a micro-batch chunk changed in transit does not open its committed root
    micro = (op.micro[0] + np.float32(1), *op.micro[1:])
    assert check_chunks(fp, (replace(openings[0], micro=micro),), s1, s2, TOPOLOGY) is Caught.PROOF


def test_malformed_answers_are_proof_failures(step1):
    s1, batch, s2, fp, _ = step1
    (op,) = answer_challenge(s1, batch, TOPOLOGY, (0,))
    bad = [replace(op, index=chunk_count(CONFIG)), replace(op, micro=op.micro[:-1]),
           replace(op, summed=op.summed.astype(np.float64)), replace(op, summed_proof=op.summed_proof[:-1])]
    assert [check_chunks(fp, (b,), s1, s2, TOPOLOGY) for b in bad] == [Caught.PROOF] * len(bad)
