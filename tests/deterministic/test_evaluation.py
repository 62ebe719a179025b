"""Certified evaluation on the engine (docs/run-format.md §9): a run that holds out documents and
evaluates every other state; any replayer recomputes the trainer's losses bit for bit."""

import cbor2
import numpy as np
import pytest
import torch

from open1b.deterministic import PRESETS, torch_twin
from open1b.deterministic.data import builtin_split
from open1b.deterministic.document_proofs import prove_document
from open1b.deterministic.documents import document_starts
from open1b.deterministic.errors import RunFormatError
from open1b.deterministic.evaluation import eval_loss, evaluate_state, loss_bits, run_eval_dataset
from open1b.deterministic.runfile import EVALUATIONS_FILE, load_checkpoint
from open1b.deterministic.trainer import publish_run
from open1b.protocol import Identity, blake2b256

HELD_OUT, EVERY, STEPS = 8, 2, 4


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("eval-run")
    manifest = publish_run(run_dir, Identity(blake2b256(b"tests/eval")), steps=STEPS, seed=5,
                           eval_documents=HELD_OUT, eval_every=EVERY)
    return run_dir, manifest


def test_the_trainer_s_losses_are_what_a_replayer_recomputes(run):
    run_dir, manifest = run
    published = dict(cbor2.loads((run_dir / EVALUATIONS_FILE).read_bytes()))
    assert sorted(published) == [2, 4]
    for k, bits in published.items():
        assert loss_bits(evaluate_state(run_dir, manifest, k)) == bits
    with pytest.raises(RunFormatError):
        evaluate_state(run_dir, manifest, 3)  # not on the schedule


def test_eval_loss_matches_float64(run):
    run_dir, manifest = run
    config = PRESETS["tiny"].config
    state = load_checkpoint(run_dir, 4, config, manifest.checkpoints[4])
    dataset = run_eval_dataset(manifest)
    tp = torch_twin.to_torch(state.params, torch.float64)
    tokens = torch.tensor(dataset.samples.astype(np.int64))
    ref = float(torch_twin.loss_sum(tp, tokens, config).detach()) / (dataset.n * config.seq_len)
    assert abs(float(eval_loss(state, dataset)) - ref) / ref < 1e-5


def test_the_held_out_documents_are_provably_not_trained_on(run):
    run_dir, manifest = run
    assert manifest.data["eval_documents"] == HELD_OUT and manifest.data["eval_every"] == EVERY
    held = builtin_split(HELD_OUT).evaluation
    starts = document_starts(held)
    for s, e in zip(starts, starts[1:] + [len(held)]):
        assert prove_document(run_dir, held[s:e], manifest).answer == "absent"
