import itertools
import random

from open1b.protocol import Attestation, StepStatus, coverage, select_claim
from open1b.protocol.claims import LEASE_ROUND_SECONDS, claim_precedence

from .conftest import NOW, ident, make_attestation, make_claim, make_manifest


def test_statuses(manifest):
    atts = [make_attestation(ident(1), manifest, 0), make_attestation(ident(2), manifest, 0),
            make_attestation(ident(1), manifest, 1), make_attestation(ident(2), manifest, 1, match=False)]
    claims = [make_claim(ident(3), manifest, 2, issued_at=NOW - 10)]
    cov = coverage(manifest, atts, claims, now=NOW, redundancy=2)
    assert [s.status for s in cov.steps] == [StepStatus.VERIFIED, StepStatus.DISPUTED, StepStatus.CLAIMED,
                                              StepStatus.UNAUDITED]
    assert cov.steps[0].auditors == tuple(sorted([ident(1).peer_id, ident(2).peer_id]))
    assert cov.steps[1].dissenters == (ident(2).peer_id,)
    assert cov.disputed_steps == [1]
    assert not cov.complete


def test_expired_claim_does_not_count(manifest):
    claims = [make_claim(ident(3), manifest, 2, issued_at=NOW - 100, lease=60)]
    assert coverage(manifest, [], claims, now=NOW).steps[2].status is StepStatus.UNAUDITED


def test_auditors_are_distinct_keys(manifest):
    same = [make_attestation(ident(1), manifest, 0, issued_at=NOW + i) for i in range(3)]
    cov = coverage(manifest, same, redundancy=2)
    assert cov.steps[0].auditors == (ident(1).peer_id,)
    assert not cov.complete


def test_complete_when_every_step_meets_redundancy(manifest):
    atts = [make_attestation(ident(i), manifest, k) for k in range(manifest.steps) for i in (1, 2)]
    assert coverage(manifest, atts, redundancy=2).complete
    assert not coverage(manifest, atts, redundancy=3).complete


def test_attestations_of_other_runs_or_inconsistent_ones_are_not_counted(manifest):
    other = make_manifest(ident(9), steps=4)
    foreign = make_attestation(ident(1), other, 0)
    cov = coverage(manifest, [foreign])
    assert cov.steps[0].status is StepStatus.UNAUDITED


def test_coverage_is_order_independent_and_idempotent(manifest):
    atts = [make_attestation(ident(i), manifest, k, match=(i + k) % 3 != 0)
            for k in range(manifest.steps) for i in range(1, 4)]
    expected = coverage(manifest, atts, redundancy=2)
    rng = random.Random(1)
    for _ in range(5):
        shuffled = atts + atts[: rng.randrange(len(atts))]
        rng.shuffle(shuffled)
        assert coverage(manifest, shuffled, redundancy=2) == expected


def test_claim_order_is_strict_and_total(manifest):
    claims = [make_claim(ident(i), manifest, 0, issued_at=NOW + dt, slot=0)
              for i in range(1, 4) for dt in (0, 1, LEASE_ROUND_SECONDS)]
    keys = [claim_precedence(c) for c in claims]
    assert len(set(keys)) == len(keys)
    winners = {p[select_claim(list(p))].digest for p in itertools.permutations(claims[:5])}
    assert len(winners) == 1


def test_newer_round_retakes_an_expired_lease(manifest):
    old = make_claim(ident(1), manifest, 0, issued_at=NOW, lease=60)
    retake = make_claim(ident(2), manifest, 0, issued_at=NOW + LEASE_ROUND_SECONDS + 5)
    same_round_later = make_claim(ident(0), manifest, 0, issued_at=NOW + 1)
    assert [old, retake][select_claim([old, retake])] is retake
    assert [old, same_round_later][select_claim([old, same_round_later])] is old


def test_device_classes_per_step_and_per_run(manifest):
    """Coverage counts distinct device classes among a step's counted matches (a mismatch adds
    none), and lists the run's; short_of_classes is the --min-classes policy."""
    gpu = dict(device="cuda/sm_90")

    def att(n, step, match=True, **change):
        a = make_attestation(ident(n), manifest, step, match=match)
        return a if not change else Attestation.create(ident(n), **{**_fields(a), **change})

    atts = [att(1, 0), att(2, 0, **gpu), att(1, 1), att(2, 1), att(3, 2, **gpu), att(4, 2, match=False)]
    cov = coverage(manifest, atts, now=NOW, redundancy=2)
    assert [len(s.devices) for s in cov.steps] == [2, 1, 1, 0]  # distinct classes per step
    assert cov.device_classes == ("cpu/x86_64-avx2", "cuda/sm_90")
    assert cov.short_of_classes(2) == [1, 2, 3] and cov.short_of_classes(1) == [3]


def _fields(a):
    return {k: v for k, v in a.body().items() if k not in ("kind", "v", "signer")}
