"""Spot checks (docs/protocol.md §5.5, §7, §8.7): the statement's rules, its own status in
coverage, and the escape probability against closed forms."""

import math
import random
from fractions import Fraction

import pytest

from open1b.protocol import (
    SpotCheck, SpotStatus, TrustPolicy, challenge_signature, derive_chunks, derive_slot, escape_probability,
    slot_signature, spot_coverage, validate_spotcheck,
)
from open1b.protocol.errors import WrongTypeError
from open1b.protocol.escape import forged_steps_at
from open1b.protocol.hashing import blake2b256
from open1b.protocol.spotcheck import CHALLENGE_CHUNKS
from tests.runs import run_manifest

from .conftest import NOW, ident

SLOTS, CHUNKS = 4, 10


def spot_manifest(steps: int = 8):
    hashes = [blake2b256(b"state", bytes([k])) for k in range(steps + 1)]
    return run_manifest(ident(0), engine="test-engine", engine_version="1",
                        model={"ranks": 2, "micro_batches": 2, "d": 8}, data={"corpus": "x"}, seed=7, steps=steps,
                        state_hashes=hashes, created_at=NOW)  # fmt: skip


def spotcheck(n: int, run, step: int, *, caught: str = "none", **over) -> SpotCheck:
    signer = ident(n)
    challenge, slot_challenge = challenge_signature(signer, run.run_id, step), slot_signature(signer, run.run_id, step)
    fields = dict(run=run.run_id, step=step, pre_state=run.state_hashes[step], fingerprint=bytes(32),
                  challenge=challenge, slot_challenge=slot_challenge, slot=derive_slot(slot_challenge, SLOTS),
                  chunks_total=CHUNKS, chunks=list(derive_chunks(challenge, CHUNKS)),
                  verdict="pass" if caught == "none" else "fail", caught=caught, engine=run.engine,
                  engine_version=run.engine_version, device="cpu/x86_64-avx2", elapsed_ms=5, issued_at=NOW)
    return SpotCheck.create(signer, **{**fields, **over})


def code(sc: SpotCheck, run) -> str:
    return validate_spotcheck(sc.encoded, {run.run_id: run}.get, NOW).code


def test_a_spot_check_round_trips_and_is_accepted():
    run = spot_manifest()
    sc = spotcheck(1, run, 3)
    assert SpotCheck.decode(sc.encoded) == sc
    assert code(sc, run) == "ok" and len(sc.chunks) == CHALLENGE_CHUNKS


@pytest.mark.parametrize("over,expected", [
    ({"step": 8}, "step_range"),
    ({"pre_state": bytes(32)}, "pre_state"),
    ({"engine_version": "2"}, "engine"),
    ({"challenge": bytes(64)}, "challenge"),
    ({"slot_challenge": bytes(64)}, "challenge"),
    ({"chunks_total": CHUNKS + 1}, "challenge_derivation"),
])
def test_rules_reject_with_their_codes(over, expected):
    run = spot_manifest()
    over = dict(over)
    assert code(spotcheck(1, run, over.pop("step", 3), **over), run) == expected


def test_a_slot_the_challenge_does_not_derive_is_rejected():
    run = spot_manifest()
    sc = spotcheck(1, run, 3)
    assert code(spotcheck(1, run, 3, slot=(sc.slot + 1) % SLOTS), run) == "challenge_derivation"
    # another key's challenge is another key's: the signer cannot borrow it, nor its slot
    assert code(spotcheck(2, run, 3, challenge=sc.challenge, slot=sc.slot, chunks=sc.chunks), run) == "challenge"
    assert code(spotcheck(2, run, 3, slot_challenge=sc.slot_challenge, slot=sc.slot), run) == "challenge"
    # the chunks' signature is not the slot's: the slot stays secret while the trainer holds the first
    assert code(spotcheck(1, run, 3, slot_challenge=sc.challenge, slot=derive_slot(sc.challenge, SLOTS)),
                run) == "challenge"


def test_a_pass_catches_nothing_and_a_fail_names_its_link():
    run = spot_manifest()
    with pytest.raises(WrongTypeError):
        spotcheck(1, run, 3, verdict="fail")
    with pytest.raises(WrongTypeError):
        spotcheck(1, run, 3, caught="update", verdict="pass")


def test_derived_challenges_are_spread_and_distinct():
    sigs = [blake2b256(i.to_bytes(2, "big")) * 2 for i in range(400)]
    assert {derive_slot(s, SLOTS) for s in sigs} == set(range(SLOTS))
    assert all(len(set(c)) == len(c) == CHALLENGE_CHUNKS and list(c) == sorted(c)
               for c in (derive_chunks(s, CHUNKS) for s in sigs))
    assert derive_chunks(bytes(64), 2) == (0, 1)  # fewer chunks than a challenge opens: all


def test_spot_checked_is_its_own_status_and_a_failure_names_the_link():
    run = spot_manifest()
    checks = [spotcheck(1, run, 0), spotcheck(2, run, 0), spotcheck(1, run, 2, caught="update")]
    cov = spot_coverage(run, checks)
    assert [s.status for s in cov.steps[:3]] == [SpotStatus.SPOT_CHECKED, SpotStatus.UNCHECKED, SpotStatus.FAILED]
    assert len(cov.steps[0].checkers) == 2 and cov.steps[2].caught == ("update",) and cov.failed_steps == [2]
    # order and duplicates change nothing (a set of statements)
    assert spot_coverage(run, list(reversed(checks)) + checks) == cov
    # untrusted keys are not counted
    only = TrustPolicy("allowlist", frozenset({ident(2).public_key}))
    assert [s.status for s in spot_coverage(run, checks, policy=only).steps[:3]] == [
        SpotStatus.SPOT_CHECKED, SpotStatus.UNCHECKED, SpotStatus.UNCHECKED]


def test_coverage_escape_matches_the_closed_form():
    run = spot_manifest()
    cov = spot_coverage(run, [spotcheck(1, run, 0), spotcheck(2, run, 0), spotcheck(1, run, 5)], replayed=[7])
    p = 1 / SLOTS
    x = [(1 - p) ** 2, 1, 1, 1, 1, 1 - p, 1, 0]
    assert cov.detection == p
    assert cov.escape_one == pytest.approx(sum(x) / 8, rel=1e-12)


def test_escape_probability_closed_forms():
    # f = 1: the mean over steps of (1 - p)^n_k
    assert escape_probability([0, 1, 2, 3], 0.5, 1) == pytest.approx((1 + 0.5 + 0.25 + 0.125) / 4, rel=1e-12)
    # every step checked n times: (1 - p)^(n f), whatever f
    assert escape_probability([3] * 50, 0.2, 7) == pytest.approx(0.8 ** 21, rel=1e-9)
    # m of S steps checked once: sum_i C(m,i) C(S-m, f-i) / C(S, f) (1-p)^i (hypergeometric)
    for S, m, f, p in [(30, 10, 4, 0.25), (200, 37, 12, 1.0), (80957, 4000, 810, 0.5)]:
        exact = sum(Fraction(math.comb(m, i) * math.comb(S - m, f - i), math.comb(S, f)) * Fraction(1 - p) ** i
                    for i in range(0, min(m, f) + 1))  # fmt: skip
        assert escape_probability([1] * m + [0] * (S - m), p, f) == pytest.approx(float(exact), rel=1e-9)
    # a replayed step catches any forgery: one forged step among S escapes with (S - r)/S
    assert escape_probability([0] * 10, 0.3, 1, replayed=[1, 2, 3]) == pytest.approx(0.7)
    assert escape_probability([0] * 10, 0.3, 10) == 1.0


def test_escape_probability_agrees_with_sampling():
    rng = random.Random(4)
    checks = [rng.randrange(4) for _ in range(40)]
    p, f = 0.3, 3
    trials = 20000
    hits = 0
    for _ in range(trials):
        forged = rng.sample(range(40), f)
        caught = any(rng.random() < p for k in forged for _ in range(checks[k]))
        hits += not caught
    expected = escape_probability(checks, p, f)
    assert abs(hits / trials - expected) < 4 * math.sqrt(expected * (1 - expected) / trials)


def test_forged_fraction():
    assert forged_steps_at(0.01, 80957) == 810 and forged_steps_at(0.01, 20) == 1 and forged_steps_at(0.01, 100) == 1
