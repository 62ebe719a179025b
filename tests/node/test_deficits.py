"""The incremental index agrees with the pure coverage function, whatever arrives in what order."""

import random

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from open1b.node import planner
from open1b.node.deficits import DeficitIndex
from open1b.protocol import Attestation, Claim, TrustPolicy, coverage
from open1b.protocol.hashing import blake2b256
from open1b.protocol.identity import public_key_from_peer_id
from tests.runs import attestation, run_manifest

from .conftest import ident

T0 = 1_800_000_000
STEPS = 12
SIGNERS = [ident(100 + i) for i in range(6)]


def _manifest():
    return run_manifest(ident(0), engine="e", engine_version="1", model={}, data={}, seed=0, steps=STEPS,
                              state_hashes=[blake2b256(b"h", bytes([k])) for k in range(STEPS + 1)], created_at=T0)


MANIFEST = _manifest()


def _att(signer, step, match, wrong=bytes(32)):
    post = MANIFEST.state_hashes[step + 1] if match else wrong
    return attestation(signer, run=MANIFEST.run_id, step=step, pre_state=MANIFEST.state_hashes[step],
                              post_state=post, verdict="match" if match else "mismatch", engine="e",
                              engine_version="1", hardware="t", device="cpu/x86_64-avx2", elapsed_ms=1, issued_at=T0)


# Statements are signed once and drawn by index: hypothesis then shrinks over plain integers. Two
# wrong post-states, so that a step's results tie two or three ways (1 : 1, 2 : 2, 1 : 1 : 1).
ATTS = [_att(s, k, m, w) for s in SIGNERS[:4] for k in range(STEPS)
        for m, w in ((True, None), (False, bytes(32)), (False, b"\x01" * 32))]
CLAIMS = [Claim.create(s, run=MANIFEST.run_id, step=k, slot=0, issued_at=T0 + start, lease_expiry=T0 + start + length)
          for s in SIGNERS[2:] for k in range(0, STEPS, 2) for start, length in ((0, 60), (30, 200), (250, 100))]


@settings(max_examples=80, deadline=None)
# two counted keys agree on another post-state than the published one: at quorum 2 the step is
# refuted, settled, and wants R attesters as any other, not R + 1 first (it did: a disputed step)
@example([7, 43], [], 2, None, 0, random.Random(0), [], 2)
@given(
    st.lists(st.integers(0, len(ATTS) - 1), max_size=40),
    st.lists(st.integers(0, len(CLAIMS) - 1), max_size=20),
    st.integers(1, 3),
    st.sampled_from([None, 2, 4]),  # whose view: an observer, or one of the claimants
    st.integers(0, 400),
    st.randoms(use_true_random=False),
    # attestations that do not count (their signers' keys are flagged or untrusted)
    st.lists(st.tuples(st.integers(2, len(SIGNERS) - 1), st.integers(0, STEPS - 1)), max_size=8),
    # with a quorum, counted keys settle steps: a step refuted is no longer disputed (§8.3, §10)
    st.sampled_from([0, 2, 3]),
)
def test_index_equals_coverage_reference(att_ids, claim_ids, redundancy, me_index, end, rnd, uncounted, quorum):
    atts = [ATTS[i] for i in att_ids]
    claims = [CLAIMS[i] for i in claim_ids]
    me = SIGNERS[me_index].public_key if me_index is not None else None
    uncounted = [(SIGNERS[s].public_key, k) for s, k in uncounted if SIGNERS[s].public_key != me]
    now = T0 + end
    cov = coverage(MANIFEST, atts, claims, now=now, redundancy=redundancy, policy=TrustPolicy(quorum=quorum))
    # the keys coverage flags stop counting, as the judge tells the planner's view (node/planner_view.py)
    flagged = {public_key_from_peer_id(c.signer) for c in cov.flagged}
    counted = [a for a in atts if a.signer not in flagged]
    uncounted += [(a.signer, a.step) for a in atts if a.signer in flagged]
    # Deliver in a random order, with time moving forward in random jumps between deliveries.
    index = DeficitIndex(STEPS, redundancy, me=me, now=T0, quorum=quorum, published=MANIFEST.state_hashes[1:])
    items = counted + claims + uncounted
    rnd.shuffle(items)
    times = sorted(rnd.randint(0, end) for _ in items)
    for item, t in zip(items, times):
        index.advance(T0 + t)
        if isinstance(item, tuple):
            index.add_uncounted(item[1], item[0])
        elif isinstance(item, Attestation):
            index.add_attestation(item.step, item.signer, item.verdict == "match", post_state=item.post_state)
        else:
            index.add_claim(item.step, item.claimant, item.issued_at, item.lease_expiry)
    index.advance(now)

    by_step = {}
    for c in claims:
        by_step.setdefault(c.step, []).append(c)
    order = planner.StepOrder(MANIFEST.run_id, me or bytes(32), STEPS)
    signed: dict[int, set[bytes]] = {}
    for signer, k in [(a.signer, a.step) for a in atts] + uncounted:
        signed.setdefault(k, set()).add(signer)
    ref = {c.step: c for c in planner.candidates(cov, me=me, order=order, attested_by_me=set(),
                                                 claims_by_step=by_step, now=now, signed_by_step=signed)}
    for k in range(STEPS):
        if k in ref:
            assert index.deficit(k) == ref[k].deficit and index.disputed(k) == ref[k].disputed
            assert index.attesters(k) == ref[k].attesters and index.state(k).finished == ref[k].finished
        else:
            assert index.deficit(k) <= 0
    assert sorted(c.step for c in planner.pick(index, order, limit=STEPS)) == sorted(ref)
    assert all(len(index.attesters(k)) >= redundancy for k in range(STEPS)) == cov.complete
    mine = {a.step for a in counted if a.signer == me}
    assert index.mine == mine


def test_lease_expiry_reopens_a_step_and_listener_sees_it():
    moves = []
    index = DeficitIndex(3, 1, now=100, listener=lambda step, old, new: moves.append((step, old, new)))
    index.add_claim(1, b"k" * 32, 100, 160)
    assert index.deficit(1) == 0 and index.open_buckets() == [1]
    index.advance(159)
    assert index.deficit(1) == 0
    index.advance(160)
    assert index.deficit(1) == 1
    assert moves == [(1, 1, 0), (1, 0, 1)]


def test_future_claim_starts_counting_when_issued():
    index = DeficitIndex(2, 1, now=100)
    index.add_claim(0, b"k" * 32, 150, 300)
    assert index.deficit(0) == 1
    index.advance(150)
    assert index.deficit(0) == 0


def test_index_stays_fast_on_a_large_run():
    # 80,957 steps (Open-1B), 2 attesters each arriving in random order: a pick stays cheap
    # because it never walks every step. The bound is loose; the point is O(1) per statement.
    import time

    steps = 80_957
    index = DeficitIndex(steps, 2, me=b"m" * 32)
    order = planner.StepOrder(b"r" * 32, b"m" * 32, steps)
    rng = random.Random(1)
    todo = list(range(steps))
    rng.shuffle(todo)
    for k in todo[: steps - 50]:
        index.add_attestation(k, b"a" * 32, True, post_state=b"P" * 32)
        index.add_attestation(k, b"b" * 32, True, post_state=b"P" * 32)
    t = time.perf_counter()
    for _ in range(200):
        cands = planner.pick(index, order)
    per_pick = (time.perf_counter() - t) / 200
    assert sorted(c.step for c in planner.pick(index, order, limit=50)) == sorted(todo[steps - 50:])
    assert len(cands) == 4 and per_pick < 0.01


def test_an_attestation_removed_leaves_the_index_as_if_it_never_came():
    """remove_attestation undoes add_attestation: per step, the other attestations of the same key
    still count, and a step stays disputed while any counted mismatch remains."""
    fresh = DeficitIndex(4, 2, me=b"m" * 32, now=T0)
    index = DeficitIndex(4, 2, me=b"m" * 32, now=T0)
    for idx in (fresh, index):
        idx.add_attestation(0, b"a" * 32, True, post_state=b"P" * 32)
        idx.add_attestation(1, b"b" * 32, False, post_state=b"X" * 32)
    index.add_attestation(0, b"c" * 32, True, post_state=b"P" * 32)
    index.add_attestation(1, b"c" * 32, False, post_state=b"X" * 32)
    index.add_attestation(1, b"b" * 32, False, post_state=b"X" * 32)  # a second statement of the same key and step
    index.remove_attestation(0, b"c" * 32, True, post_state=b"P" * 32)
    index.remove_attestation(1, b"c" * 32, False, post_state=b"X" * 32)
    assert index.disputed(1)  # b's two mismatches still count
    index.remove_attestation(1, b"b" * 32, False, post_state=b"X" * 32)
    assert [index.state(k) for k in range(4)] == [fresh.state(k) for k in range(4)]
    assert [index.bucket(k) for k in range(4)] == [fresh.bucket(k) for k in range(4)]
    with pytest.raises(ValueError):
        index.remove_attestation(2, b"a" * 32, True, post_state=b"P" * 32)  # never counted there


def test_stragglers_tail_and_device_classes():
    """The index's half of docs/protocol.md §10.1: which steps wait on live claims alone and
    when they would be done, the pace and median replay time of recent attesters, and the steps
    each device class matched."""
    a, b, c, d = (bytes([i]) * 32 for i in range(1, 5))
    index = DeficitIndex(4, 2, now=1000)
    index.add_claim(0, a, 1000, 4600, expected_done=1000 + 18 * 3600)  # slow
    index.add_claim(0, b, 1000, 4600, expected_done=1000 + 3600)  # fast
    index.add_claim(1, c, 1000, 4600, expected_done=1000 + 18 * 3600)  # one slot held, one open
    index.add_attestation(2, d, True, "cuda/sm_90", 3000.0, post_state=b"P" * 32)
    index.add_claim(2, a, 1000, 4600, expected_done=1000 + 6 * 3600)
    # step 0 wants both claimants to finish: the later, a's; step 1 still wants a claimant
    assert index.straggling(0) == 1000 + 18 * 3600 and index.straggling(1) is None
    assert index.straggling(2) == 1000 + 6 * 3600  # d attested: it waits on a alone
    assert index.stragglers(2000, exclude=(), limit=4) == [0, 2]  # latest first
    assert index.stragglers(1000 + 7 * 3600, exclude=(), limit=4) == [0]
    assert index.stragglers(2000, exclude={0}, limit=1) == [2]
    index.add_claim(2, b, 1100, 4700, expected_done=1100 + 3600)  # a speculative claim
    assert index.straggling(2) == 1000 + 6 * 3600  # its lease has not begun
    index.advance(1100)
    assert index.straggling(2) == 1100 + 3600  # b would complete it; only a faster node may race it
    index.add_claim(2, c, 1100, 4700, expected_done=1100 + 1800)
    assert index.straggling(2) is None  # W + 1 unfinished claims: the bound
    index.add_attestation(2, b, True, "cpu/arm64", 3500.0, post_state=b"P" * 32)
    assert set(index.matched_by("cuda/sm_90")) == {2} and set(index.matched_by("cpu/arm64")) == {2}
    assert set(index.attested_steps()) == {2}
    tail = index.tail()
    assert tail.open_replays == 1 + 2  # step 1 wants one more claimant, untouched step 3 two
    assert tail.typical_s == 3500.0 and tail.pace == 2 / 100  # 2 arrivals over 100 s (at least 60)
    # b stops counting: it leaves the class and the pace
    index.remove_attestation(2, b, True, "cpu/arm64", post_state=b"P" * 32)
    assert set(index.matched_by("cpu/arm64")) == set() and index.tail().pace == 1 / 100
    assert index.tail().typical_s == 3000.0
    index.advance(1100 + 3601)  # the pace window has passed; the leases are over
    assert index.tail().pace == 0 and index.tail().typical_s is None
    assert index.straggling(0) is None  # its claims ended unfinished: the step is open again


def test_a_disputed_step_whose_results_tie_wants_one_more_attester():
    """2 : 2 settles no quorum, so nobody who contradicts the step is ever flagged: while no
    post-state has strictly more keys than every other, the step wants one attester more than it
    has, and one honest replay more (3 : 2) settles it at quorum 3."""
    honest, wrong = [ident(110 + i) for i in range(3)], [ident(120 + i) for i in range(2)]
    atts = [_att(k, 0, True) for k in honest[:2]] + [_att(k, 0, False) for k in wrong]
    index = DeficitIndex(STEPS, 2, now=T0)

    def add(a):
        index.add_attestation(a.step, a.signer, a.verdict == "match", post_state=a.post_state)

    def reference(atts):
        cov = coverage(MANIFEST, atts, now=T0, redundancy=2)
        order = planner.StepOrder(MANIFEST.run_id, bytes(32), STEPS)
        return {c.step: c for c in planner.candidates(cov, me=None, order=order, attested_by_me=set(),
                                                     claims_by_step={}, now=T0)}

    for a in atts:
        add(a)
    assert index.disputed(0) and index.deficit(0) == 1 and index.state(0).slots(2) == 5
    assert index.bucket(0) > 0 and 0 in {c.step for c in planner.pick(index, planner.StepOrder(b"r", b"m", STEPS))}
    assert reference(atts)[0].deficit == 1 and reference(atts)[0].slots == 5
    third = _att(honest[2], 0, True)
    add(third)
    assert index.deficit(0) <= 0 and index.bucket(0) == 0 and 0 not in reference(atts + [third])
    flagged = coverage(MANIFEST, atts + [third], redundancy=2, policy=TrustPolicy(quorum=3)).flagged
    assert {c.signer for c in flagged} == {k.peer_id for k in wrong}
    index.remove_attestation(0, third.signer, True, post_state=third.post_state)
    assert index.deficit(0) == 1  # tied again
    # A step disputed without a tie wants R + 1 as before; a third post-state ties 1 : 1 : 1.
    assert planner.wanted(True, 2, 3) == 3 and planner.wanted(True, 2, 3, tied=True) == 4
    assert planner.tied((2, 2)) and planner.tied((1, 1, 1)) and not planner.tied((3, 2)) and not planner.tied((2, 0))
