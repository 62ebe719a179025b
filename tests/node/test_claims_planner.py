from collections import Counter

from open1b.node import claims as planner
from open1b.protocol import Attestation, Claim, coverage

from .conftest import ident

NOW = 1_800_000_000


def _att(signer, manifest, step, match=True):
    post = manifest.state_hashes[step + 1] if match else bytes(32)
    return Attestation.create(signer, run=manifest.run_id, step=step, pre_state=manifest.state_hashes[step],
                              post_state=post, verdict="match" if match else "mismatch", engine=manifest.engine,
                              engine_version=manifest.engine_version, hardware="t", elapsed_ms=1, issued_at=NOW)


def _claim(signer, manifest, step, slot=0, issued_at=NOW):
    return Claim.create(signer, run=manifest.run_id, step=step, slot=slot, issued_at=issued_at,
                        lease_expiry=issued_at + 60)


def test_rendezvous_spreads_first_choices_evenly():
    peers = [ident(i).public_key for i in range(4)]
    run = b"\x01" * 32
    firsts = Counter(min(peers, key=lambda p: planner.rendezvous_score(run, k, p)) for k in range(400))
    assert set(firsts) == set(peers)
    assert all(60 <= n <= 140 for n in firsts.values())  # 100 expected each
    for k in range(20):
        ranks = sorted(planner.rendezvous_rank(run, k, p, peers) for p in peers)
        assert ranks == [0, 1, 2, 3]


def test_candidates_order_and_filters(manifest):
    me, other = ident(1), ident(2)
    atts = [_att(other, manifest, 0), _att(other, manifest, 1, match=False)]
    cov = coverage(manifest, atts, now=NOW, redundancy=1)
    busy = {3: [_claim(other, manifest, 3)]}
    cands = planner.candidates(cov, me=me.public_key, peers=[other.public_key], attested_by_me={4},
                               claims_by_step=busy, now=NOW)
    steps = [c.step for c in cands]
    assert steps[0] == 1  # a disputed step wants a second opinion, and comes first
    assert 0 not in steps  # already has its one attester
    assert 3 not in steps  # someone else holds a live claim
    assert 4 not in steps  # never attest a step twice
    assert set(steps) == {1, 2, 5}


def test_expired_claims_do_not_block(manifest):
    cov = coverage(manifest, [], now=NOW, redundancy=1)
    stale = {3: [_claim(ident(2), manifest, 3, issued_at=NOW - 100)]}
    cands = planner.candidates(cov, me=ident(1).public_key, peers=[], attested_by_me=set(),
                               claims_by_step=stale, now=NOW)
    assert 3 in [c.step for c in cands]


def test_free_slot_rules(manifest):
    me, other = ident(1), ident(2)
    live_other = _claim(other, manifest, 0, slot=0)
    assert planner.free_slot({}, 1, me=me.public_key, attesters=set(), now=NOW) == 0
    assert planner.free_slot({0: live_other}, 1, me=me.public_key, attesters=set(), now=NOW) is None
    assert planner.free_slot({0: live_other}, 2, me=me.public_key, attesters=set(), now=NOW) == 1
    assert planner.free_slot({0: live_other}, 1, me=me.public_key, attesters={other.peer_id}, now=NOW) == 0
    assert planner.free_slot({0: live_other}, 1, me=me.public_key, attesters=set(), now=NOW + 61) == 0
    mine = _claim(me, manifest, 0, slot=0)
    assert planner.free_slot({0: mine}, 1, me=me.public_key, attesters=set(), now=NOW) == 0
