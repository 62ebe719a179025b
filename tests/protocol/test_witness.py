"""Proof of replay: witness reveals and the copier rule of coverage (protocol/witness.py, coverage.py)."""

import dataclasses
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from open1b.protocol import (
    Attestation, Outcome, StepStatus, TrustPolicy, WitnessReveal, coverage, decode_message, validate_reveal,
    witness_binding,
)
from open1b.protocol.coverage import CONTRADICTION, COPIER
from open1b.protocol.hashing import blake2b256

from .conftest import NOW, ident, make_attestation, make_manifest
from tests.runs import attestation, witness_of

MANIFEST = make_manifest(ident(0), steps=4)


def att(signer: int, step: int, *, match: bool = True, issued_at: int = NOW) -> Attestation:
    """An honest attestation: its witness binds the step's true W_k to its own key."""
    return make_attestation(ident(signer), MANIFEST, step, match=match, issued_at=issued_at)


def copy_of(source: Attestation, copier: int) -> Attestation:
    """``source`` re-signed by another key with every field copied, its witness binding included."""
    fields = {f.name: getattr(source, f.name) for f in dataclasses.fields(source) if f.name not in ("sig", "signer")}
    return Attestation.create(ident(copier), **fields)


def reveal(step: int, revealer: int = 1, *, witness: bytes | None = None, issued_at: int = NOW,
           manifest=MANIFEST) -> WitnessReveal:
    return WitnessReveal.create(ident(revealer), run=manifest.run_id, step=step,
                                witness=witness_of(step) if witness is None else witness, issued_at=issued_at)


def runs(manifest=MANIFEST):
    return {manifest.run_id: manifest}.get


# -- the reveal message and its validation ------------------------------------------------------
def test_a_reveal_round_trips_and_is_known_to_decode_message():
    r = reveal(2)
    assert WitnessReveal.decode(r.encoded) == r and decode_message(r.encoded) == r
    assert r.signer_key == ident(1).public_key and len(r.encoded) <= WitnessReveal.MAX_SIZE


def test_a_reveal_that_opens_the_commitment_is_accepted():
    verdict = validate_reveal(reveal(1).encoded, runs(), NOW)
    assert verdict.accepted and verdict.message == reveal(1)


def test_a_reveal_with_another_witness_is_rejected():
    verdict = validate_reveal(reveal(1, witness=witness_of(2)).encoded, runs(), NOW)
    assert (verdict.outcome, verdict.code) == (Outcome.REJECT, "witness")


def test_reveal_step_range_unknown_run_and_future():
    assert validate_reveal(reveal(4).encoded, runs(), NOW).code == "step_range"
    other = make_manifest(ident(3), steps=4)
    verdict = validate_reveal(reveal(1, manifest=other).encoded, runs(), NOW)
    assert (verdict.outcome, verdict.code) == (Outcome.IGNORE, "unknown_run")
    verdict = validate_reveal(reveal(1, issued_at=NOW + 3600).encoded, runs(), NOW)
    assert (verdict.outcome, verdict.code) == (Outcome.IGNORE, "future")


def test_a_reveal_is_not_an_attestation():
    verdict = validate_reveal(att(1, 1).encoded, runs(), NOW)
    assert (verdict.outcome, verdict.code) == (Outcome.REJECT, "kind")


# -- the copier rule --------------------------------------------------------------------------
def test_honest_bindings_count_and_nobody_is_flagged():
    cov = coverage(MANIFEST, [att(1, 0), att(2, 0), att(3, 1)], reveals=[reveal(0), reveal(1)])
    assert cov.flagged == () and cov.steps[0].auditors == tuple(sorted([ident(1).peer_id, ident(2).peer_id]))


def test_a_copied_binding_is_flagged_with_evidence_and_none_of_its_attestations_count():
    source, copied = att(1, 2), copy_of(att(1, 2), 5)
    other = att(5, 3)  # a statement of the copier that would be fine on its own
    r = reveal(2, revealer=1)
    cov = coverage(MANIFEST, [source, copied, other, att(2, 3)], reveals=[r], redundancy=1)
    [flag] = cov.flagged
    assert (flag.signer, flag.kind, flag.step) == (ident(5).peer_id, COPIER, 2)
    assert (flag.statement, flag.conflicting, flag.reveal) == (copied.digest, source.digest, r.digest)
    assert cov.steps[2].auditors == (ident(1).peer_id,)
    assert cov.steps[3].auditors == (ident(2).peer_id,)  # its other attestation stops counting too
    # the evidence re-checks from the statements alone
    assert copied.witness != witness_binding(MANIFEST.run_id, 2, copied.signer, r.witness)
    assert source.witness == witness_binding(MANIFEST.run_id, 2, source.signer, r.witness)


def test_without_a_reveal_a_copier_is_not_caught():
    cov = coverage(MANIFEST, [att(1, 2), copy_of(att(1, 2), 5)])
    assert cov.flagged == () and len(cov.steps[2].auditors) == 2


def test_a_reveal_alone_flags_nobody_without_a_replay_that_knew_the_witness():
    # A trainer that commits to a bogus W_k and reveals it cannot frame honest auditors by itself:
    # a flag needs another counted key whose match binds the revealed witness. Their matches of
    # that step no longer count (the trainer only withholds coverage from its own run), but
    # everything else they said does: a dispute they raised elsewhere stands.
    bogus = blake2b256(b"not the step's witness")
    manifest = _with_commitment(1, bogus)
    honest = [make_attestation(ident(s), manifest, 1) for s in (1, 2)]
    dispute = make_attestation(ident(1), manifest, 3, match=False)
    r = reveal(1, revealer=0, witness=bogus, manifest=manifest)
    assert validate_reveal(r.encoded, runs(manifest), NOW).accepted  # the trainer can open its own commitment
    cov = coverage(manifest, [*honest, dispute, make_attestation(ident(2), manifest, 0)], reveals=[r],
                   policy=TrustPolicy(quorum=2))
    assert cov.flagged == () and cov.steps[1].status is StepStatus.UNAUDITED
    assert cov.steps[3].status is StepStatus.DISPUTED and cov.steps[0].auditors == (ident(2).peer_id,)


def test_a_match_the_reveal_disproves_does_not_count_even_without_a_backer():
    # Key 5's made-up binding meets a reveal (by a replayer this policy does not count, say): no
    # counted key proves it knew W_1, so nobody is flagged, but key 5's match is unproven.
    made_up = attestation(ident(5), run=MANIFEST.run_id, step=1, pre_state=MANIFEST.state_hashes[1],
                          post_state=MANIFEST.state_hashes[2], verdict="match", engine=MANIFEST.engine,
                          engine_version=MANIFEST.engine_version, hardware="t", device="cpu/x86_64-avx2", elapsed_ms=1, issued_at=NOW,
                          witness=b"\x05" * 32)
    cov = coverage(MANIFEST, [made_up, att(5, 2)], reveals=[reveal(1, 9)])
    assert cov.flagged == () and cov.steps[1].status is StepStatus.UNAUDITED
    assert cov.steps[2].auditors == (ident(5).peer_id,)


def _with_commitment(step: int, witness: bytes):
    from open1b.protocol.witness import witness_commitment

    from tests.runs import run_manifest

    commitments = [witness_commitment(witness_of(k)) for k in range(4)]
    commitments[step] = witness_commitment(witness)
    return run_manifest(ident(0), engine="test-engine", engine_version="1", model={"d": 8}, data={}, seed=7, steps=4,
                        state_hashes=[blake2b256(b"state", bytes([k])) for k in range(5)], created_at=NOW,
                        witnesses=commitments)


def test_mismatches_are_not_judged_by_their_binding():
    # A replay of a step whose batch the trainer forged computes another witness: its binding
    # cannot match W_k, and it must still count.
    dissent = attestation(ident(3), run=MANIFEST.run_id, step=1, pre_state=MANIFEST.state_hashes[1],
                          post_state=blake2b256(b"forged"), verdict="mismatch", engine=MANIFEST.engine,
                          engine_version=MANIFEST.engine_version, hardware="t", device="cpu/x86_64-avx2", elapsed_ms=1, issued_at=NOW,
                          witness=witness_binding(MANIFEST.run_id, 1, ident(3).public_key, b"\x07" * 32))
    cov = coverage(MANIFEST, [att(1, 1), dissent], reveals=[reveal(1)])
    assert cov.flagged == () and cov.steps[1].status is StepStatus.DISPUTED
    assert cov.steps[1].dissenters == (ident(3).peer_id,)


def test_invalid_reveals_and_untrusted_copiers_are_ignored():
    copied = copy_of(att(1, 0), 5)
    wrong = reveal(0, witness=witness_of(3))
    assert coverage(MANIFEST, [att(1, 0), copied], reveals=[wrong]).flagged == ()
    cov = coverage(MANIFEST, [att(1, 0), copied], reveals=[reveal(0)],
                   policy=TrustPolicy("allowlist", frozenset({ident(1).public_key})))
    assert cov.flagged == () and cov.untrusted == (ident(5).peer_id,)


def test_copier_flag_takes_precedence_and_copiers_do_not_settle_results():
    # Two copiers echo a match of a step two honest replays refute: excluded as copiers before
    # the quorum counts, they cannot outvote the refutation.
    liar = att(1, 0)
    honest = [att(2, 0, match=False), att(3, 0, match=False)]
    copiers = [copy_of(liar, 5), copy_of(liar, 6)]
    cov = coverage(MANIFEST, [liar, *honest, *copiers, att(4, 0)], reveals=[reveal(0, revealer=4)],
                   policy=TrustPolicy(quorum=2))
    assert {f.signer: f.kind for f in cov.flagged} == {ident(5).peer_id: COPIER, ident(6).peer_id: COPIER}
    assert cov.steps[0].status is StepStatus.DISPUTED  # two against two: nothing settles, nobody honest flagged
    # without the reveal the copies outvote the honest replays, which are flagged instead
    fooled = coverage(MANIFEST, [liar, *honest, *copiers, att(4, 0)], policy=TrustPolicy(quorum=2))
    assert {f.signer for f in fooled.flagged} == {ident(2).peer_id, ident(3).peer_id}
    assert all(f.kind == CONTRADICTION for f in fooled.flagged)


@settings(max_examples=25, deadline=None)
@given(st.randoms(use_true_random=False))
def test_flags_do_not_depend_on_the_order_statements_arrive_in(rnd: random.Random):
    atts = [att(1, 0), att(2, 0), copy_of(att(1, 0), 5), copy_of(att(2, 0), 5), att(3, 1), copy_of(att(3, 1), 6),
            copy_of(att(3, 1), 7), att(4, 1), att(6, 2), att(1, 1, issued_at=NOW - 1)]
    reveals = [reveal(0, 1), reveal(0, 2), reveal(1, 3), reveal(1, 3, issued_at=NOW - 5), reveal(2, 6)]
    want = coverage(MANIFEST, atts, reveals=reveals, policy=TrustPolicy(quorum=2))
    assert {f.signer for f in want.flagged} == {ident(5).peer_id, ident(6).peer_id, ident(7).peer_id}
    rnd.shuffle(atts)
    rnd.shuffle(reveals)
    assert coverage(MANIFEST, atts, reveals=reveals, policy=TrustPolicy(quorum=2)) == want


def test_a_liar_caught_both_ways_carries_the_contradiction():
    # Key 5 vouches for step 0 without replaying (a made-up binding) while two replays refute it,
    # and its match of step 1 fails the revealed W_1: the stronger evidence, a false result, wins.
    made_up = attestation(ident(5), run=MANIFEST.run_id, step=1, pre_state=MANIFEST.state_hashes[1],
                          post_state=MANIFEST.state_hashes[2], verdict="match", engine=MANIFEST.engine,
                          engine_version=MANIFEST.engine_version, hardware="t", device="cpu/x86_64-avx2", elapsed_ms=1, issued_at=NOW,
                          witness=b"\x05" * 32)
    atts = [att(5, 0), att(2, 0, match=False), att(3, 0, match=False), made_up, att(2, 1)]
    cov = coverage(MANIFEST, atts, reveals=[reveal(1, 2)], policy=TrustPolicy(quorum=2))
    [flag] = cov.flagged
    assert (flag.signer, flag.kind, flag.step, flag.reveal) == (ident(5).peer_id, CONTRADICTION, 0, b"")
    assert coverage(MANIFEST, atts, reveals=[reveal(1, 2)]).flagged[0].kind == COPIER  # quorum 0: nothing settles
