"""Coverage with convictions (docs/protocol.md §8.3, §18.7): a fraud proof's verdict refutes the
publisher's step or flags an auditor, with no trust and no quorum, citing the proof."""

from open1b.protocol import Conviction, StepStatus, TrustPolicy, coverage
from open1b.protocol.coverage import CONTRADICTION, FRAUD
from open1b.protocol.hashing import blake2b256
from open1b.protocol.identity import peer_id_from_public_key

from .conftest import ident, make_attestation, make_manifest

PUB, A, B, C = ident(0), ident(1), ident(2), ident(3)
M = make_manifest(PUB, steps=4)


def conviction(key, step, *, proof=b"p", post=None, pre=None, run=None) -> Conviction:
    return Conviction(run or M.run_id, step, key.public_key, pre or M.state_hashes[step],
                      M.state_hashes[step + 1] if post is None else post, blake2b256(proof))


def test_a_conviction_of_the_publisher_refutes_its_step_without_a_quorum_citing_the_proof():
    atts = [make_attestation(A, M, 1), make_attestation(B, M, 1)]  # two keys vouch for step 1
    proofs = [conviction(PUB, 1, proof=b"y"), conviction(PUB, 1, proof=b"x")]
    cov = coverage(M, atts, convictions=proofs, policy=TrustPolicy())
    step = cov.steps[1]
    assert step.status is StepStatus.REFUTED and cov.refuted_steps == [1]
    assert step.fraud_proofs == tuple(sorted(c.proof for c in proofs))
    assert step.auditors == tuple(sorted(peer_id_from_public_key(k.public_key) for k in (A, B)))
    [flag] = cov.flagged  # the publisher's key, at its lowest step, the lowest proof there
    assert (flag.signer, flag.step, flag.kind, flag.statement, flag.conflicting) == (
        peer_id_from_public_key(PUB.public_key), 1, FRAUD, min(c.proof for c in proofs), b"")
    assert [s.status for s in cov.steps] == [StepStatus.UNAUDITED, StepStatus.REFUTED, StepStatus.UNAUDITED,
                                            StepStatus.UNAUDITED]


def test_a_conviction_of_a_trace_that_is_not_the_published_step_flags_but_does_not_refute():
    cov = coverage(M, [make_attestation(A, M, 1)], convictions=[conviction(PUB, 1, post=b"\x01" * 32)])
    assert cov.steps[1].status is StepStatus.VERIFIED and cov.steps[1].fraud_proofs == ()
    assert [f.kind for f in cov.flagged] == [FRAUD]


def test_a_convicted_auditor_is_flagged_and_counts_nowhere_in_the_run():
    atts = [make_attestation(A, M, 1, match=False), make_attestation(A, M, 2), make_attestation(B, M, 2)]
    before = coverage(M, atts)
    assert before.steps[1].status is StepStatus.DISPUTED and not before.flagged
    cov = coverage(M, atts, convictions=[conviction(A, 1, post=b"\x02" * 32)])
    assert cov.steps[1].status is StepStatus.UNAUDITED and cov.steps[1].fraud_proofs == ()
    assert cov.steps[2].auditors == (peer_id_from_public_key(B.public_key),)
    assert [(f.signer, f.step, f.kind) for f in cov.flagged] == [(peer_id_from_public_key(A.public_key), 1, FRAUD)]


def test_a_conviction_needs_no_trust_and_replaces_a_contradiction_flag():
    policy = TrustPolicy("allowlist", frozenset({A.public_key, B.public_key, C.public_key}), quorum=2)
    atts = [make_attestation(A, M, 0), make_attestation(B, M, 0), make_attestation(C, M, 0, match=False)]
    assert [f.kind for f in coverage(M, atts, policy=policy).flagged] == [CONTRADICTION]
    cov = coverage(M, atts, policy=policy, convictions=[conviction(C, 0, post=b"\x03" * 32)])
    assert [(f.kind, f.statement) for f in cov.flagged] == [(FRAUD, blake2b256(b"p"))]
    # the publisher is no root of this policy: its conviction still refutes
    assert coverage(M, [], policy=policy, convictions=[conviction(PUB, 3)]).steps[3].status is StepStatus.REFUTED


def test_convictions_about_another_run_state_or_step_are_not_read():
    for c in (conviction(PUB, 1, run=b"\x09" * 32), conviction(PUB, 1, pre=b"\x04" * 32),
              Conviction(M.run_id, 4, PUB.public_key, M.state_hashes[4], M.state_hashes[4], b"\x05" * 32)):
        cov = coverage(M, [], convictions=[c])
        assert not cov.flagged and cov.refuted_steps == []
