"""The run side of spot checks (docs/run-format.md §10): the trainer records fingerprints without
changing a bit, answers a challenge from its run directory, and the verifier's ``check_spot``
passes an honest answer and fails each malformed one with ``proof``, never with an exception."""

import shutil

import cbor2
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from open1b.deterministic.fingerprint import CHUNK_ELEMENTS, chunk_count
from open1b.deterministic import PRESETS
from open1b.deterministic.data import batch_for_step
from open1b.deterministic.errors import CheckpointMismatchError
from open1b.deterministic.provenance import load_run_samples
from open1b.deterministic.runfile import state_link, genesis_hash, load_checkpoint, read_manifest
from open1b.deterministic.spot_run import (
    ANSWER, MAX_ANSWER_SIZE, MICRO, SpotInputError, answer_from_run, check_spot, decode_answer, load_fingerprints,
)  # fmt: skip
from open1b.deterministic.trainer import config_of, publish_run
from open1b.protocol import Identity, blake2b256, encode
from open1b.protocol.commitments import state_hash_of_root
from open1b.protocol.fingerprints import FINGERPRINTS_FILE, KEY_BLOB, KEY_ROOT
from open1b.protocol.spotcheck import CAUGHT, challenge_signature, derive_chunks, derive_slot, slot_signature

TRAINER, VERIFIER = Identity(blake2b256(b"tests/spot-run/trainer")), Identity(blake2b256(b"tests/spot-run/verifier"))
STEPS, SEED = 2, 4
CONFIG = PRESETS["tiny"].config


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same tiny run trained with and without fingerprints."""
    root = tmp_path_factory.mktemp("spot-run")
    with_fp = publish_run(root / "with", TRAINER, steps=STEPS, seed=SEED)
    without = publish_run(root / "without", TRAINER, steps=STEPS, seed=SEED, fingerprints=False)
    return root / "with", with_fp, root / "without", without


@pytest.fixture(scope="module")
def answered(runs):
    """Step 1's challenges by VERIFIER (the chunks', the slot's) and the trainer's answer."""
    run_dir, manifest, *_ = runs
    challenge = challenge_signature(VERIFIER, manifest.run_id, 1)
    return challenge, slot_signature(VERIFIER, manifest.run_id, 1), answer_from_run(run_dir, 1, challenge)


def test_recording_fingerprints_changes_no_bit_of_training(runs):
    run_dir, with_fp, _, without = runs
    assert with_fp.checkpoints == without.checkpoints and with_fp.witnesses == without.witnesses
    assert KEY_ROOT in with_fp.data and KEY_ROOT not in without.data
    # h_0's genesis commits to the data map, which now names the fingerprints: re-linking the
    # fingerprinted run's states from the plain run's genesis gives the plain run's chain exactly
    assert with_fp.state_hashes != without.state_hashes
    config, topology = config_of(with_fp)
    dataset = load_run_samples(run_dir, with_fp)
    prev = genesis_hash(without.body())
    for k in range(STEPS + 1):
        state = load_checkpoint(run_dir, k, config, with_fp.checkpoints[k])
        batch = batch_for_step(dataset, SEED, k - 1, config, topology) if k else None
        prev = state_hash_of_root(prev, *state_link(state, batch))
        assert prev == without.state_hashes[k]
    assert len(load_fingerprints(run_dir, with_fp)) == STEPS


def test_an_honest_answer_passes_and_names_what_was_checked(runs, answered):
    run_dir, manifest, *_ = runs
    challenge, slot_challenge, answer = answered
    result = check_spot(run_dir, 1, challenge, slot_challenge, answer)
    slots = manifest.model["ranks"] * manifest.model["micro_batches"]
    config_chunks = chunk_count(CONFIG)
    assert result.slot == derive_slot(slot_challenge, slots) and result.chunks == derive_chunks(challenge, config_chunks)
    assert result.passed and result.verdict == "pass" and result.caught == "none"
    assert result.chunks_total == config_chunks and result.step == 1 and result.run == manifest.run_id
    assert result.pre_state == manifest.state_hashes[1]
    assert result.fingerprint == load_fingerprints(run_dir, manifest)[1].commitment
    assert len(answer) <= MAX_ANSWER_SIZE and cbor2.loads(answer)["step"] == 1


def test_no_answer_is_a_fail(runs, answered):
    run_dir, *_ = runs
    result = check_spot(run_dir, 1, *answered[:2], None)
    assert (result.passed, result.verdict, result.caught) == (False, "fail", "no_answer")


def test_the_two_halves_of_a_check_give_the_whole_checks_verdicts(runs, answered):
    run_dir, *_ = runs
    challenge, slot_challenge, answer = answered
    micro = check_spot(run_dir, 1, challenge, slot_challenge, None, links=(MICRO,))  # needs no answer, and holds
    lengths = [min(CHUNK_ELEMENTS, CONFIG.n_params() - c * CHUNK_ELEMENTS) for c in micro.chunks]
    assert (micro.passed, micro.caught) == (True, "none") and len(micro.recomputed) == 4 * sum(lengths)
    mine = micro.recomputed
    assert check_spot(run_dir, 1, challenge, slot_challenge, answer, links=(ANSWER,), recomputed=mine).passed
    assert check_spot(run_dir, 1, challenge, slot_challenge, None, links=(ANSWER,), recomputed=mine).caught == "no_answer"
    bad = _reencode(answer, _flip_summed_byte)
    assert check_spot(run_dir, 1, challenge, slot_challenge, bad, links=(ANSWER,), recomputed=mine).caught == "update"
    assert check_spot(run_dir, 1, challenge, slot_challenge, bad, links=(MICRO,)).passed  # the answer is not read
    with pytest.raises(ValueError, match="recomputation"):
        check_spot(run_dir, 1, challenge, slot_challenge, answer, links=(ANSWER,))
    with pytest.raises(SpotInputError, match="recomputation"):
        check_spot(run_dir, 1, challenge, slot_challenge, answer, links=(ANSWER,), recomputed=mine[:-4])
    for links in [(), ("micro", "chunks"), ("everything",)]:
        with pytest.raises(ValueError, match="links"):
            check_spot(run_dir, 1, challenge, slot_challenge, answer, links=links)


def test_the_secret_slot_decides_which_answered_micro_batch_is_compared(runs, answered):
    """An answer that swaps one element between slots 0 and 1 (rank 0's two micro-batches, whose
    sum is the same either way round): a verifier whose secret slot is either catches it at
    ``gradient``; one with another slot passes it (the sum holds), which is why the slot is secret
    until the answer is in."""
    run_dir, manifest, *_ = runs
    challenge, _, answer = answered
    value = cbor2.loads(answer)
    for op in value["openings"]:
        a, b = (np.frombuffer(x, "<f4").copy() for x in op["micro"][:2])
        i = int(np.flatnonzero(a != b)[0])
        a[i], b[i] = b[i], a[i]
        op["micro"][:2] = [a.tobytes(), b.tobytes()]
    moved = encode(value)
    assert moved != answer
    caught = {}
    for i in range(64):  # verifiers until every slot is someone's secret slot
        verifier = Identity(blake2b256(f"tests/spot-run/verifier/{i}".encode()))
        slot_challenge = slot_signature(verifier, manifest.run_id, 1)
        result = check_spot(run_dir, 1, challenge, slot_challenge, moved)
        caught[result.slot] = result.caught
    assert caught == {0: "gradient", 1: "gradient", 2: "none", 3: "none"}


def _reencode(answer: bytes, edit) -> bytes:
    value = cbor2.loads(answer)
    edit(value)
    return encode(value)


def _flip_summed_byte(value):
    """An exponent bit of the first answered summed element: no commitment holds the summed
    chunk, so only the update to checkpoint k+1 can tell."""
    first = value["openings"][0]
    first["summed"] = first["summed"][:3] + bytes([first["summed"][3] ^ 0x40]) + first["summed"][4:]


MALFORMED = {
    "not cbor": lambda a: b"\xff\x00",
    "empty": lambda a: b"",
    "oversize": lambda a: bytes(MAX_ANSWER_SIZE + 1),
    "not canonical": lambda a: cbor2.dumps(dict(reversed(list(cbor2.loads(a).items())))),  # "openings" first
    "a list": lambda a: encode([1, 2]),
    "another step": lambda a: _reencode(a, lambda v: v.__setitem__("step", 0)),
    "step as text": lambda a: _reencode(a, lambda v: v.__setitem__("step", "1")),
    "an extra field": lambda a: _reencode(a, lambda v: v.__setitem__("note", 1)),
    "one opening short": lambda a: _reencode(a, lambda v: v["openings"].pop()),
    "other chunks": lambda a: _reencode(a, lambda v: v["openings"][0].__setitem__("chunk", 7 - v["openings"][0]["chunk"])),
    "a slot short": lambda a: _reencode(a, lambda v: v["openings"][0]["micro"].pop()),
    "a truncated array": lambda a: _reencode(a, lambda v: v["openings"][0].__setitem__("summed", v["openings"][0]["summed"][:-1])),
    "float64 bytes": lambda a: _reencode(a, lambda v: v["openings"][0].__setitem__("summed", v["openings"][0]["summed"] * 2)),
    "a proof per slot (an r6 answer)": lambda a: _reencode(a, lambda v: v["openings"][0].__setitem__("micro_proofs", [])),
    "a summed proof (an r8-draft answer)": lambda a: _reencode(a, lambda v: v["openings"][0].__setitem__("summed_proof", [])),
    "a micro chunk as a list": lambda a: _reencode(a, lambda v: v["openings"][0]["micro"].__setitem__(0, [1.0])),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_answer_fails_with_proof(runs, answered, case):
    run_dir, *_ = runs
    challenge, slot_challenge, answer = answered
    bad = MALFORMED[case](answer)
    assert bad != answer
    assert check_spot(run_dir, 1, challenge, slot_challenge, bad).caught == "proof"


def test_the_answer_is_canonical_and_holds_whole_chunks(answered):
    *_, answer = answered
    assert encode(cbor2.loads(answer)) == answer
    lengths = {len(op["summed"]) for op in cbor2.loads(answer)["openings"]}
    last = 4 * (CONFIG.n_params() - (chunk_count(CONFIG) - 1) * CHUNK_ELEMENTS)
    assert lengths <= {4 * CHUNK_ELEMENTS, last}


def test_a_run_without_fingerprints_cannot_be_spot_checked(runs):
    _, _, plain_dir, plain = runs
    challenge = challenge_signature(VERIFIER, plain.run_id, 0)
    with pytest.raises(SpotInputError, match="no fingerprints"):
        check_spot(plain_dir, 0, challenge, slot_signature(VERIFIER, plain.run_id, 0), None)


def test_a_fingerprints_file_that_is_not_the_committed_one_is_refused(runs, tmp_path):
    run_dir, manifest, *_ = runs
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    data = (copy / FINGERPRINTS_FILE).read_bytes()
    (copy / FINGERPRINTS_FILE).write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(SpotInputError, match=KEY_BLOB):
        load_fingerprints(copy, read_manifest(copy))
    (copy / FINGERPRINTS_FILE).write_bytes(bytes(10_000_000))
    with pytest.raises(SpotInputError, match="at most"):
        load_fingerprints(copy, manifest)
    (copy / FINGERPRINTS_FILE).unlink()
    (copy / FINGERPRINTS_FILE).symlink_to(run_dir / FINGERPRINTS_FILE)  # the right bytes, behind a link
    with pytest.raises(SpotInputError, match="cannot read"):
        load_fingerprints(copy, manifest)


def test_a_checkpoint_that_is_not_the_runs_is_refused_not_judged(runs, answered, tmp_path):
    run_dir, *_ = runs
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    (copy / "checkpoints" / "00000002.safetensors").write_bytes((run_dir / "checkpoints" / "00000001.safetensors")
                                                                .read_bytes())  # fmt: skip
    with pytest.raises(CheckpointMismatchError):
        check_spot(copy, 1, *answered)
    assert check_spot(copy, 1, *answered[:2], None).caught == "no_answer"  # without an answer k+1 is not read


def test_every_caught_value_is_the_protocols(runs, answered):
    from open1b.deterministic.fingerprint import Caught

    assert {c.value for c in Caught} == set(CAUGHT)


def test_two_processes_record_the_fingerprints_of_one(runs, tmp_path):
    """--ranks 2 (gloo): each rank sends its micro-batches' fingerprints in the exchange vector and
    rank 0 assembles the step's, byte for byte those of the one-process trainer."""
    run_dir, manifest, *_ = runs
    two = publish_run(tmp_path / "two", TRAINER, steps=STEPS, seed=SEED, ranks=2)
    assert manifest.model["ranks"] == 2
    assert (tmp_path / "two" / FINGERPRINTS_FILE).read_bytes() == (run_dir / FINGERPRINTS_FILE).read_bytes()
    assert two.data == manifest.data and two.state_hashes == manifest.state_hashes


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=256))
def test_decoding_arbitrary_bytes_as_an_answer_never_raises(data):
    assert decode_answer(data, 1, (0, 3, 4, 5), 4, CONFIG.n_params()) is None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(at=st.integers(min_value=0), bit=st.integers(min_value=0, max_value=7))
def test_a_flipped_bit_anywhere_in_an_answer_never_raises(answered, at, bit):
    """Each flip gives bytes that are not an answer (None) or openings of other values, which the
    checks then refuse at ``proof``; decoding never raises."""
    *_, answer = answered
    chunks = tuple(op["chunk"] for op in cbor2.loads(answer)["openings"])
    flipped = bytearray(answer)
    flipped[at % len(answer)] ^= 1 << bit
    openings = decode_answer(bytes(flipped), 1, chunks, 4, CONFIG.n_params())
    assert openings is None or len(openings) == len(chunks)
