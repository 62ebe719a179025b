"""The forged runs of the spot-check scenarios (docs/run-format.md §10.3): each passes manifest
validation, replays cleanly except at its forged step, and is caught there by ``check_spot`` with
the link the spec names, the forger answering as consistently with its commitments as it can."""

import itertools

import pytest

from open1b.deterministic.replay import replay
from open1b.deterministic.runfile import MANIFEST_FILE
from open1b.deterministic.spot_run import answer_from_run, check_spot
from open1b.deterministic.trainer import config_of, publish_run
from open1b.devnet.forged_run import forged_answer, forged_slot, publish_forged_run
from open1b.protocol import Identity, blake2b256, validate_manifest
from open1b.protocol.spotcheck import challenge_signature, derive_slot, slot_signature

from ..node.conftest import ident

STEPS, FORGED = 4, 2
NOW = 2**40


def _challenges(manifest, step):
    """((challenge, slot challenge), slot) of a run of verifier keys."""
    _, topology = config_of(manifest)
    slots = topology.ranks * topology.micro_batches
    for i in itertools.count():
        key = Identity(blake2b256(b"tests/forged-spot", bytes([i])))
        sigs = challenge_signature(key, manifest.run_id, step), slot_signature(key, manifest.run_id, step)
        yield sigs, derive_slot(sigs[1], slots)


@pytest.fixture(scope="module", params=["forged-data", "skipped-update", "forged-microbatch"])
def forged(request, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp(request.param)
    manifest = publish_forged_run(run_dir, ident(0), steps=STEPS, seed=6, forgeries={FORGED: request.param})
    return request.param, run_dir, manifest


def test_the_forged_run_is_a_valid_run_whose_only_broken_step_is_the_forged_one(forged):
    kind, run_dir, manifest = forged
    assert validate_manifest((run_dir / MANIFEST_FILE).read_bytes(), NOW).accepted
    assert [k for k in range(STEPS) if not replay(run_dir, k).match] == [FORGED]


EXPECTED = {"forged-data": "loss", "skipped-update": "update", "forged-microbatch": "gradient"}


def test_a_spot_check_of_the_forged_step_catches_it_with_the_specs_link(forged):
    kind, run_dir, manifest = forged
    slots = manifest.model["ranks"] * manifest.model["micro_batches"]
    want = forged_slot(FORGED, slots)
    # forged-microbatch is caught only by a challenge whose secret slot is the forged one; the others by any
    challenge, _ = next((c, s) for c, s in _challenges(manifest, FORGED) if kind != "forged-microbatch" or s == want)
    result = check_spot(run_dir, FORGED, *challenge, forged_answer(run_dir, FORGED, challenge[0]))
    assert (result.passed, result.caught) == (False, EXPECTED[kind])


def test_honest_steps_of_a_forged_run_pass(forged):
    kind, run_dir, manifest = forged
    challenge, _ = next(_challenges(manifest, FORGED - 1))
    assert check_spot(run_dir, FORGED - 1, *challenge, forged_answer(run_dir, FORGED - 1, challenge[0])).passed


def test_the_forgers_answer_for_an_honest_run_is_the_honest_answer(tmp_path):
    manifest = publish_run(tmp_path, ident(0), steps=1, seed=6)
    challenge, _ = next(_challenges(manifest, 0))
    assert forged_answer(tmp_path, 0, challenge[0]) == answer_from_run(tmp_path, 0, challenge[0])


def test_a_forged_loss_is_caught_by_the_loss_sum_and_by_no_replay(tmp_path):
    manifest = publish_forged_run(tmp_path, ident(0), steps=2, seed=6, forgeries={1: "forged-loss"})
    assert all(replay(tmp_path, k).match for k in range(2))
    challenge, _ = next(_challenges(manifest, 1))
    assert check_spot(tmp_path, 1, *challenge, forged_answer(tmp_path, 1, challenge[0])).caught == "loss_sum"


def test_a_forged_micro_batch_escapes_a_challenge_of_another_slot(tmp_path):
    """Detection per challenge is 1 / slots, not 1: the forger answers with the chunks it committed."""
    manifest = publish_forged_run(tmp_path, ident(0), steps=STEPS, seed=6, forgeries={FORGED: "forged-microbatch"})
    slots = manifest.model["ranks"] * manifest.model["micro_batches"]
    challenge, _ = next((c, s) for c, s in _challenges(manifest, FORGED) if s != forged_slot(FORGED, slots))
    assert check_spot(tmp_path, FORGED, *challenge, forged_answer(tmp_path, FORGED, challenge[0])).passed
