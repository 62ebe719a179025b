"""Trust policies, settled results, refuted steps and flagged keys (protocol/coverage.py)."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from open1b.protocol import Attestation, StepStatus, TrustPolicy, coverage
from open1b.protocol.hashing import blake2b256

from .conftest import NOW, ident, make_attestation, make_manifest
from tests.runs import attestation

MANIFEST = make_manifest(ident(0), steps=4)
SETTLE = TrustPolicy(quorum=2)


def att(signer: int, step: int, *, match: bool = True, post: bytes | None = None, issued_at: int = NOW) -> Attestation:
    if post is None:
        return make_attestation(ident(signer), MANIFEST, step, match=match, issued_at=issued_at)
    return attestation(
        ident(signer), run=MANIFEST.run_id, step=step, pre_state=MANIFEST.state_hashes[step], post_state=post,
        verdict="match" if post == MANIFEST.state_hashes[step + 1] else "mismatch", engine=MANIFEST.engine,
        engine_version=MANIFEST.engine_version, hardware="test", device="cpu/x86_64-avx2", elapsed_ms=1, issued_at=issued_at)


def test_default_policy_is_r2_coverage():
    atts = [att(1, 0), att(2, 0, match=False), att(3, 0, match=False)]
    cov = coverage(MANIFEST, atts, redundancy=1)
    assert cov.steps[0].status is StepStatus.DISPUTED  # two agreeing mismatches settle nothing without a quorum
    assert cov.flagged == () and cov.untrusted == () and cov.policy == TrustPolicy()
    assert cov.steps[0].auditors == (ident(1).peer_id,)


def test_agreeing_mismatches_refute_the_step_and_flag_the_key_that_matched():
    liar, honest = att(1, 0), [att(2, 0, match=False), att(3, 0, match=False)]
    cov = coverage(MANIFEST, [liar, *honest, att(1, 1), att(2, 1)], redundancy=2, policy=SETTLE)
    assert cov.steps[0].status is StepStatus.REFUTED
    assert cov.refuted_steps == [0] and cov.disputed_steps == [0]
    assert cov.steps[0].dissenters == tuple(sorted([ident(2).peer_id, ident(3).peer_id]))
    assert cov.steps[0].auditors == ()  # the flagged key no longer counts
    assert cov.steps[0].evidence == tuple(sorted(a.digest for a in honest))
    [flag] = cov.flagged
    assert (flag.signer, flag.step, flag.statement) == (ident(1).peer_id, 0, liar.digest)
    assert flag.conflicting == min(a.digest for a in honest)
    # its other statements stop counting too: step 1 is left with one attester
    assert cov.steps[1].auditors == (ident(2).peer_id,) and not cov.complete


def test_a_lone_mismatch_against_settled_matches_is_flagged_and_the_step_verified():
    cov = coverage(MANIFEST, [att(1, 2), att(2, 2), att(3, 2, match=False)], redundancy=2, policy=SETTLE)
    assert cov.steps[2].status is StepStatus.VERIFIED and cov.steps[2].dissenters == ()
    assert [f.signer for f in cov.flagged] == [ident(3).peer_id]


def test_one_against_one_settles_nothing():
    cov = coverage(MANIFEST, [att(1, 0), att(2, 0, match=False)], policy=SETTLE)
    assert cov.steps[0].status is StepStatus.DISPUTED and cov.flagged == ()


def test_dissenters_that_disagree_with_each_other_leave_the_step_disputed_until_a_majority():
    odd = blake2b256(b"another wrong result")
    atts = [att(1, 0, match=False), att(2, 0, post=odd)]
    assert coverage(MANIFEST, atts, policy=SETTLE).steps[0].status is StepStatus.DISPUTED
    cov = coverage(MANIFEST, atts + [att(3, 0, match=False)], policy=SETTLE)
    assert cov.steps[0].status is StepStatus.REFUTED and [f.signer for f in cov.flagged] == [ident(2).peer_id]


def test_a_key_reporting_two_results_for_one_step_is_flagged_by_its_own_statements():
    a, b = att(4, 1), att(4, 1, match=False)
    cov = coverage(MANIFEST, [a, b], policy=SETTLE)
    [flag] = cov.flagged
    assert {flag.statement, flag.conflicting} == {a.digest, b.digest}
    assert cov.steps[1].status is StepStatus.UNAUDITED


def test_evidence_against_a_liar_cites_a_key_that_is_not_flagged_itself():
    # A vouches for every step's published hash without replaying; B disputes every step. Step 0
    # is honest (two replays match), step 1 forged (two replays agree on another result). Pick
    # A's key so that its match on step 0 has the lowest digest among those backing the result.
    honest_matches = [att(2, 0), att(3, 0)]
    a = next(n for n in range(10, 300) if att(n, 0).digest < min(x.digest for x in honest_matches))
    liar, accuser = [att(a, 0), att(a, 1)], [att(9, 0, match=False), att(9, 1, post=blake2b256(b"made up"))]
    forged = [att(4, 1, match=False), att(5, 1, match=False)]
    cov = coverage(MANIFEST, [*liar, *accuser, *honest_matches, *forged], policy=SETTLE)
    flags = {f.signer: f for f in cov.flagged}
    assert set(flags) == {ident(a).peer_id, ident(9).peer_id}
    assert flags[ident(9).peer_id].conflicting == min(x.digest for x in honest_matches)  # not the liar's match
    assert flags[ident(a).peer_id].conflicting == min(x.digest for x in forged)


def test_allowlist_counts_only_its_roots():
    roots = frozenset({ident(1).public_key, ident(2).public_key})
    sybils = [att(n, k) for n in range(10, 30) for k in range(4)]
    cov = coverage(MANIFEST, [att(1, 0), att(2, 1), *sybils], redundancy=1,
                   policy=TrustPolicy("allowlist", roots))
    assert [s.status for s in cov.steps] == [StepStatus.VERIFIED, StepStatus.VERIFIED, StepStatus.UNAUDITED,
                                              StepStatus.UNAUDITED]
    assert cov.untrusted == tuple(sorted(ident(n).peer_id for n in range(10, 30)))
    assert coverage(MANIFEST, sybils, redundancy=1).complete  # the same statements under `open`


def test_policy_arguments_are_checked():
    with pytest.raises(ValueError):
        TrustPolicy("everyone")
    with pytest.raises(ValueError):
        TrustPolicy(quorum=1)


# Every statement a property test draws from: 6 keys, 4 steps, three possible results per step.
WRONG = [blake2b256(b"wrong", bytes([i])) for i in range(2)]
POOL = [att(s, k, post=p) for s in range(1, 7) for k in range(4) for p in (MANIFEST.state_hashes[k + 1], *WRONG)]
policies = st.builds(TrustPolicy, st.sampled_from(["open", "allowlist"]),
                     st.frozensets(st.sampled_from([ident(s).public_key for s in range(1, 7)])),
                     st.sampled_from([0, 2, 3]))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, len(POOL) - 1), max_size=30), policies, st.randoms(use_true_random=False))
def test_coverage_depends_only_on_the_set_of_statements(picks, policy, rng):
    atts = [POOL[i] for i in picks]
    expected = coverage(MANIFEST, atts, redundancy=2, policy=policy)
    shuffled = atts + atts[: rng.randrange(len(atts) + 1)]
    rng.shuffle(shuffled)
    assert coverage(MANIFEST, shuffled, redundancy=2, policy=policy) == expected


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, len(POOL) - 1), max_size=30), st.lists(st.integers(0, len(POOL) - 1), max_size=40))
def test_keys_outside_the_allowlist_change_nothing_but_the_untrusted_list(picks, extra):
    roots = frozenset({ident(1).public_key, ident(2).public_key, ident(3).public_key})
    policy = TrustPolicy("allowlist", roots, quorum=2)
    trusted = [POOL[i] for i in picks if POOL[i].signer in roots]
    outsiders = [POOL[i] for i in extra if POOL[i].signer not in roots]
    base = coverage(MANIFEST, trusted, redundancy=2, policy=policy)
    with_sybils = coverage(MANIFEST, trusted + outsiders, redundancy=2, policy=policy)
    assert with_sybils.steps == base.steps and with_sybils.flagged == base.flagged


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, len(POOL) - 1), max_size=30))
def test_flags_carry_checkable_evidence(picks):
    atts = [POOL[i] for i in picks]
    by_digest = {a.digest: a for a in atts}
    cov = coverage(MANIFEST, atts, policy=SETTLE)
    flagged = {f.signer for f in cov.flagged}
    for flag in cov.flagged:
        mine, other = by_digest[flag.statement], by_digest[flag.conflicting]
        assert mine.signer_peer_id == flag.signer and mine.step == other.step == flag.step
        assert mine.pre_state == other.pre_state and mine.post_state != other.post_state
        assert all(flag.signer not in (s.auditors + s.dissenters) for s in cov.steps)
        if other.signer_peer_id in flagged - {flag.signer}:  # cited a flagged key: only if no other backs it
            assert all(a.signer_peer_id in flagged for a in atts
                       if a.step == flag.step and a.post_state == other.post_state)
    for s in cov.steps:
        assert (s.status is StepStatus.REFUTED) <= bool(s.evidence)
        assert len(s.evidence) >= len(s.dissenters)


def test_random_large_mix_is_order_independent():
    rng = random.Random(7)
    atts = rng.sample(POOL, 40)
    expected = coverage(MANIFEST, atts, redundancy=2, policy=SETTLE)
    for _ in range(5):
        rng.shuffle(atts)
        assert coverage(MANIFEST, atts, redundancy=2, policy=SETTLE) == expected
