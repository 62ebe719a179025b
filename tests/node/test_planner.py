from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from open1b.node import planner
from open1b.node.deficits import DeficitIndex
from open1b.protocol import Claim, coverage
from tests.runs import attestation

from .conftest import ident

NOW = 1_800_000_000
RUN = b"\x01" * 32


def _att(signer, manifest, step, match=True):
    post = manifest.state_hashes[step + 1] if match else bytes(32)
    return attestation(signer, run=manifest.run_id, step=step, pre_state=manifest.state_hashes[step],
                              post_state=post, verdict="match" if match else "mismatch", engine=manifest.engine,
                              engine_version=manifest.engine_version, hardware="t", device="cpu/x86_64-avx2", elapsed_ms=1, issued_at=NOW)


def _claim(signer, manifest, step, slot=0, issued_at=NOW):
    return Claim.create(signer, run=manifest.run_id, step=step, slot=slot, issued_at=issued_at,
                        lease_expiry=issued_at + 60)


def test_scalar_and_vector_scores_agree():
    key = planner.preference_key(RUN, ident(1).public_key)
    steps = np.array([0, 1, 2, 80_956, 2**40], dtype=np.int64)
    assert planner.preference_scores(key, steps).tolist() == [planner.preference_score(key, int(s)) for s in steps]


def test_own_orders_spread_first_choices_evenly():
    # Each of 8 nodes prefers its own steps; over 4000 steps the node that likes a step best
    # is close to uniform, as rendezvous ranking would give.
    keys = [planner.preference_key(RUN, ident(i).public_key) for i in range(8)]
    firsts = Counter(min(range(8), key=lambda n: planner.preference_score(keys[n], k)) for k in range(4000))
    assert set(firsts) == set(range(8))
    assert all(400 <= n <= 600 for n in firsts.values())  # 500 expected each


def test_order_prefix_is_the_best_steps_sorted():
    order = planner.StepOrder(RUN, ident(2).public_key, 5000, prefix=64)
    everything = order.best(range(5000), 5000)
    assert order.prefix.tolist() == everything[:64]
    assert order.best([10, 20, 30, 40], 2, exclude={everything[0]}) == sorted(
        [10, 20, 30, 40], key=lambda s: (order.score(s), s))[:2]


def test_candidates_order_and_filters(manifest):
    me, other = ident(1), ident(2)
    order = planner.StepOrder(manifest.run_id, me.public_key, manifest.steps)
    atts = [_att(other, manifest, 0), _att(other, manifest, 1, match=False)]
    cov = coverage(manifest, atts, now=NOW, redundancy=1)
    busy = {3: [_claim(other, manifest, 3)]}
    cands = planner.candidates(cov, me=me.public_key, order=order, attested_by_me={4}, claims_by_step=busy, now=NOW)
    steps = [c.step for c in cands]
    assert steps[0] == 1  # a disputed step wants a second opinion, and comes first
    assert cands[0].slots == 2 and cands[0].attesters == {other.public_key}
    assert 0 not in steps  # already has its one attester
    assert 3 not in steps  # someone else holds a live claim
    assert 4 not in steps  # never attest a step twice
    assert set(steps) == {1, 2, 5}
    assert [c.step for c in cands[1:]] == sorted([2, 5], key=order.score)


def test_expired_claims_do_not_block(manifest):
    cov = coverage(manifest, [], now=NOW, redundancy=1)
    order = planner.StepOrder(manifest.run_id, ident(1).public_key, manifest.steps)
    stale = {3: [_claim(ident(2), manifest, 3, issued_at=NOW - 100)]}
    cands = planner.candidates(cov, me=ident(1).public_key, order=order, attested_by_me=set(),
                               claims_by_step=stale, now=NOW)
    assert 3 in [c.step for c in cands]


def test_free_slot_rules(manifest):
    me, other = ident(1), ident(2)
    live_other = _claim(other, manifest, 0, slot=0)
    assert planner.free_slot({}, 1, me=me.public_key, attesters=set(), now=NOW) == 0
    assert planner.free_slot({0: live_other}, 1, me=me.public_key, attesters=set(), now=NOW) is None
    assert planner.free_slot({0: live_other}, 2, me=me.public_key, attesters=set(), now=NOW) == 1
    assert planner.free_slot({0: live_other}, 1, me=me.public_key, attesters={other.public_key}, now=NOW) == 0
    assert planner.free_slot({0: live_other}, 1, me=me.public_key, attesters=set(), now=NOW + 61) == 0
    mine = _claim(me, manifest, 0, slot=0)
    assert planner.free_slot({0: mine}, 1, me=me.public_key, attesters=set(), now=NOW) == 0
    # A finished claimant's slot is the last resort: a claim over it in the same lease round
    # would lose to it. An empty or expired slot, or one we hold, comes first.
    done = {other.public_key}
    assert planner.free_slot({0: live_other, 1: None}, 2, me=me.public_key, attesters=done, now=NOW) == 1
    stale = _claim(ident(3), manifest, 0, slot=1, issued_at=NOW - 100)
    assert planner.free_slot({0: live_other, 1: stale}, 2, me=me.public_key, attesters=done, now=NOW) == 1
    assert planner.free_slot({0: live_other, 1: mine}, 2, me=me.public_key, attesters=done, now=NOW) == 1
    assert planner.free_slot({0: live_other, 1: _claim(ident(3), manifest, 0, slot=1)}, 2, me=me.public_key,
                             attesters=done, now=NOW) == 0


@settings(max_examples=60, deadline=None)
@given(st.integers(200, 3000), st.integers(1, 3), st.data())
def test_pick_scans_and_scores_to_the_same_answer(steps, redundancy, data):
    """The prefix scan and the exact scoring of a bucket's members agree, whatever the buckets
    hold: pick over the index equals the sorted list of every open step."""
    me = ident(3).public_key
    index = DeficitIndex(steps, redundancy, me=me)
    covered = data.draw(st.sets(st.integers(0, steps - 1), max_size=steps))
    for s in covered:
        for a in range(data.draw(st.integers(1, redundancy))):
            index.add_attestation(s, ident(10 + a).public_key, match=True, post_state=b"P" * 32)
    exclude = data.draw(st.sets(st.integers(0, steps - 1), max_size=50))
    order = planner.StepOrder(RUN, me, steps, prefix=data.draw(st.sampled_from([16, 128, 1024])))
    limit = data.draw(st.integers(1, 6))
    got = [c.step for c in planner.pick(index, order, exclude=exclude, limit=limit)]
    want = sorted((s for s in range(steps) if s not in exclude and index.deficit(s) > 0),
                  key=lambda s: (-index.deficit(s), order.score(s), s))[:limit]
    assert got == want


def test_the_planners_view_of_a_run_frees_a_claimed_step_when_its_lease_ends_in_virtual_time(tmp_path, manifest):
    """On trio's MockClock: a peer's two-hour lease keeps step 0 out of the plan for exactly two
    (virtual) hours; an attestation fills step 1 for good."""
    import trio
    from trio.testing import MockClock

    from open1b.node.clock import Clock

    from .fakes import make_ledger

    t0 = manifest.created_at + 10
    ledger = make_ledger(tmp_path / "node", manifest, clock=Clock(wall_at_zero=t0), redundancy=1,
                         trusted_peers=(ident(6).peer_id,))
    lease = Claim.create(ident(5), run=manifest.run_id, step=0, slot=0, issued_at=t0, lease_expiry=t0 + 7200)

    def planned() -> set[int]:
        deficits = ledger.planner
        index = deficits.index(manifest.run_id)
        return {c.step for c in planner.pick(index, deficits.order(manifest.run_id), limit=manifest.steps)}

    async def main():
        ledger.statements.add_claim(lease)
        assert ledger.statements.ingest_attestation(_att(ident(6), manifest, 1).encoded)
        assert planned() == set(range(manifest.steps)) - {0, 1}
        await trio.sleep(7199)
        assert 0 not in planned()
        await trio.sleep(1)
        assert planned() == set(range(manifest.steps)) - {1}
        return trio.current_time()

    assert trio.run(main, clock=MockClock(autojump_threshold=0)) == 7200


def test_steps_a_spot_check_failed_come_first_while_they_want_attesters():
    """pick_first: the failed steps that still want attesters, ahead of pick's choice (docs/protocol.md
    §8.7: full replays go where spot checks point); covered and excluded ones are left out."""
    me = ident(3).public_key
    index = DeficitIndex(64, 1, me=me)
    index.add_attestation(40, ident(10).public_key, match=True, post_state=b"P" * 32)  # covered: nothing more wanted
    order = planner.StepOrder(RUN, me, 64)
    first = planner.pick_first(index, order, [50, 40, 7, 9], exclude={9})
    assert [c.step for c in first] == [7, 50]
    assert all(c.deficit == 1 and c.slots == 1 for c in first)
    assert [c.step for c in planner.pick(index, order, limit=2)] != [7, 50]  # pick alone would choose others


def test_replay_estimate_follows_measured_replays():
    est = planner.ReplayEstimate()
    assert est.seconds is None and est.expected_done(100) is None
    est.update(1000)
    assert est.seconds == 1000 and est.expected_done(100) == 1100
    est.update(2000)
    assert est.seconds == 1000 + planner.ESTIMATE_WEIGHT * 1000


def test_deadline_leaves_the_tail_to_faster_nodes():
    """An 18-hour laptop stops claiming when a 1-hour node would get to the step and finish
    sooner; with the pace unknown everyone claims; an equal node always claims."""
    hour = 3600
    tail = planner.Tail(open_replays=3600, pace=1.0, typical_s=hour)  # an hour of work left, then an hour
    assert planner.meets_deadline(hour, tail, 0) and planner.meets_deadline(3 * hour, tail, 0)
    assert not planner.meets_deadline(18 * hour, tail, 0)
    assert planner.meets_deadline(None, tail, 0)
    assert planner.meets_deadline(18 * hour, planner.Tail(3600, 0.0, hour), 0)  # no pace: no deadline
    assert planner.meets_deadline(1.2 * hour, planner.Tail(0, 0.0, hour), 0)  # nothing open: a replay away


def test_plan_offers_a_straggler_only_to_a_node_that_would_beat_it():
    a, b = (bytes([i]) * 32 for i in (1, 2))
    index = DeficitIndex(1, 2, now=0)
    index.add_claim(0, a, 0, 3600, expected_done=18 * 3600)
    index.add_claim(0, b, 0, 3600, expected_done=3600)
    order = planner.StepOrder(b"r" * 32, b"me", 1)
    fast = planner.plan(index, order, now=60, estimate_s=3000)
    assert [(c.step, c.slots, c.speculative) for c in fast] == [(0, 3, True)]
    assert planner.plan(index, order, now=60, estimate_s=12 * 3600) == []  # 60 + 1.5 x 12 h > 18 h
    assert planner.plan(index, order, now=60, estimate_s=3000, tail=False) == []  # the issue-6 rules


def test_the_last_slot_of_a_step_one_class_matched_waits_a_while_for_another_class():
    """docs/protocol.md §10.1, the class wait (r16): while another class about as fast is live, a
    node does not take the last slot of a step that only its own class matched or replays, for
    CLASS_WAIT of that class's typical turnarounds (claim to attestation); a node of another
    class takes it at once, the first replay of a step is never held back, and nobody waits for
    a much slower class."""
    gpu, cpu = "cuda/sm_90", "cpu/x86_64"
    a, b, c = (bytes([i]) * 32 for i in (1, 2, 3))
    index = DeficitIndex(4, 2, now=0)
    index.add_claim(0, a, 0, 3600)
    index.add_claim(1, c, 20, 3600)
    index.advance(100)
    index.add_attestation(0, a, True, gpu, 60.0, post_state=b"P" * 32)  # turnaround 100 s: claimed at 0, attested at 100
    index.add_attestation(1, c, True, cpu, 50.0, post_state=b"P" * 32)  # turnaround 80 s
    order = planner.StepOrder(b"r" * 32, b"me", 4)

    def steps(device, now):
        index.advance(now)
        return sorted(cand.step for cand in planner.plan(index, order, now=now, device=device, estimate_s=60, limit=4))

    assert planner.CLASS_WAIT == 6.0 and planner.TAIL_MARGIN == 1.5
    assert steps(gpu, 101) == [1, 2, 3]  # step 0's last slot waits 6 x 80 s for the CPU; 2 and 3 want a first replay
    assert steps(cpu, 101) == [0, 2, 3]  # step 1's waits 6 x 100 s for the GPU (100 <= 1.5 x 80)
    assert steps(gpu, 100 + 479) == [1, 2, 3]
    assert steps(gpu, 100 + 480) == [0, 1, 2, 3]  # the wait is over: it never idles the network for good
    assert steps(cpu, 100 + 599) == [0, 2, 3] and steps(cpu, 100 + 600) == [0, 1, 2, 3]
    # a replay in flight by a key whose class an attestation told counts as that class's
    index.add_attestation(2, b, True, gpu, 40.0, post_state=b"P" * 32)
    index.add_claim(3, b, 700, 4000)
    assert 3 not in steps(gpu, 700) and 3 in steps(cpu, 700)
    assert 3 in steps(gpu, 700 + 480)  # the wait runs from the claim's issue
    index.add_claim(3, c, 1200, 4000)  # c's CPU replay too: complete
    assert 3 not in steps(gpu, 1201) and 3 not in steps(cpu, 1201)
    # nobody waits for a class whose warm turnarounds (a key's later replays: its first carries the
    # run's one-time costs) are more than TAIL_MARGIN times slower, or with none other live
    for other in (None, 200.0):
        alone = DeficitIndex(4, 2, now=0)
        alone.add_attestation(1, a, True, gpu, 60.0, post_state=b"P" * 32)  # a's first: cold
        alone.add_attestation(0, a, True, gpu, 60.0, post_state=b"P" * 32)
        if other is not None:
            alone.add_attestation(2, c, True, cpu, other, post_state=b"P" * 32)
            alone.add_attestation(3, c, True, cpu, other, post_state=b"P" * 32)
        found = planner.plan(alone, planner.StepOrder(b"r" * 32, b"me", 4), now=1, device=gpu, estimate_s=60)
        assert 0 in [cand.step for cand in found]
        if other is not None:  # measured cold alone, the same class is presumed about as fast: the step waits
            cold = DeficitIndex(4, 2, now=0)
            cold.add_attestation(1, a, True, gpu, 60.0, post_state=b"P" * 32)
            cold.add_attestation(0, a, True, gpu, 60.0, post_state=b"P" * 32)
            cold.add_attestation(2, c, True, cpu, other, post_state=b"P" * 32)
            assert 0 not in [cand.step for cand in planner.plan(cold, planner.StepOrder(b"r" * 32, b"me", 4), now=1,
                                                                device=gpu, estimate_s=60)]


def test_a_class_measured_only_on_first_replays_is_waited_for_until_a_warm_one_says_it_is_slower():
    """docs/protocol.md §10.1 (r21), the devnet under load that failed the class wait: the CPU class
    had warm turnarounds of about 16 s, the other class only the first replays of its keys (40 s:
    fetching the run's files and starting a worker beside everyone else's); the CPU node judged it
    2.5 times slower and took last slots only the CPU had matched. A first replay is cold: the
    class is about as fast until its warm turnarounds say otherwise, and the wait runs on its cold
    median meanwhile."""
    gpu, cpu = "cuda/sm_90", "cpu/x86_64"
    c1, c2, g1, g2 = (bytes([i]) * 32 for i in (1, 2, 3, 4))
    index = DeficitIndex(8, 2, now=0)
    for step, key, issued, done in ((0, c1, 0, 16), (1, c1, 16, 32), (2, c2, 0, 16), (3, c2, 16, 31),
                                    (4, g1, 0, 40), (5, g2, 0, 40)):
        index.add_claim(step, key, issued, issued + 600)
        index.advance(done)
        index.add_attestation(step, key, True, cpu if key in (c1, c2) else gpu, 1.0, post_state=b"P" * 32)
    order = planner.StepOrder(b"r" * 32, b"me", 8)

    def held(device, step, now):
        index.advance(now)
        return step not in {cand.step for cand in planner.plan(index, order, now=now, device=device, estimate_s=1,
                                                               limit=8)}

    assert held(cpu, 1, 41) and held(cpu, 3, 41)  # only the CPU matched steps 1 and 3: 6 x 40 s for the other class
    assert not held(cpu, 1, 32 + 240)
    index.add_claim(6, g1, 40, 640)
    index.advance(152)
    index.add_attestation(6, g1, True, gpu, 1.0, post_state=b"P" * 32)  # warm, and much slower: 112 s
    assert not held(cpu, 3, 153)  # 112 > 1.5 x 16: the CPU does not wait for it any more


def test_a_claim_that_names_its_device_class_tells_the_class_wait_what_is_in_flight():
    """docs/protocol.md §10.1 (r21): the class of a replay in flight is the one its claim names,
    so a node of another class takes the step's last slot at once and a node of the same class
    waits — even when the claimant has attested nothing yet. A claim that names no class falls
    back to the claimant's latest attestation, and with none counts as the planning node's own
    (both classes wait: the race the named class ends)."""
    gpu, cpu = "cuda/sm_90", "cpu/x86_64"
    a, c, new_gpu, new_cpu, old = (bytes([i]) * 32 for i in (1, 3, 4, 5, 6))
    index = DeficitIndex(4, 2, now=0)
    index.add_claim(0, a, 0, 3600)
    index.add_claim(1, c, 20, 3600)
    index.advance(100)
    index.add_attestation(0, a, True, gpu, 60.0, post_state=b"P" * 32)  # both classes live, about as fast
    index.add_attestation(1, c, True, cpu, 50.0, post_state=b"P" * 32)
    index.add_claim(2, new_gpu, 100, 3700, device=gpu)  # keys that attested nothing yet
    index.add_claim(3, new_cpu, 100, 3700, device=cpu)
    order = planner.StepOrder(b"r" * 32, b"me", 4)

    def steps(device, now):
        index.advance(now)
        return {cand.step for cand in planner.plan(index, order, now=now, device=device, estimate_s=60, limit=4)}

    assert {2, 3} & steps(cpu, 101) == {2} and {2, 3} & steps(gpu, 101) == {3}
    # without the class in its claim, a key no attestation told the class of counts as either planner's own
    blind = DeficitIndex(4, 2, now=0)
    for step, key, device in ((0, a, gpu), (1, c, cpu)):
        blind.add_claim(step, key, step * 20, 3600)
        blind.advance(100)
        blind.add_attestation(step, key, True, device, 60.0 - 10 * step, post_state=b"P" * 32)
    blind.add_claim(2, old, 100, 3700)
    for device in (gpu, cpu):
        assert 2 not in {cand.step for cand in planner.plan(blind, order, now=101, device=device, estimate_s=60)}
    # the run's first round, nothing matched: a replay in flight whose claim names another class is no reason to wait
    first = DeficitIndex(2, 2, now=0)
    first.add_claim(0, a, 0, 600, device=gpu)
    first.add_claim(1, c, 0, 600)
    first.advance(10)
    assert sorted(cand.step for cand in planner.plan(first, planner.StepOrder(b"r" * 32, b"me", 2), now=10,
                                                     device=cpu, estimate_s=60)) == [0]
    assert planner.plan(first, planner.StepOrder(b"r" * 32, b"me", 2), now=10, device=gpu, estimate_s=60) == []


def test_before_anything_is_matched_a_second_replay_waits_for_the_first():
    """The run's first round (nothing matched, no class known): the last slot of a step whose
    only replay is in flight waits until that replay attests — its class is then known — or its
    lease ends; steps that want a first replay are offered as ever."""
    a = bytes([1]) * 32
    index = DeficitIndex(2, 2, now=0)
    index.add_claim(0, a, 0, 600)
    order = planner.StepOrder(b"r" * 32, b"me", 2)

    def steps(now):
        index.advance(now)
        return sorted(c.step for c in planner.plan(index, order, now=now, device="cuda/sm_90", estimate_s=60))

    assert steps(10) == [1]
    assert sorted(c.step for c in planner.plan(index, order, now=10, estimate_s=60)) == [0, 1]  # no class: no wait
    assert steps(600) == [0, 1]  # the lease ended: the step wants two replays again
    index.add_claim(0, a, 600, 1200)
    index.advance(700)
    index.add_attestation(0, a, True, "cuda/sm_90", 60.0, post_state=b"P" * 32)
    assert steps(701) == [0, 1]  # one class known and no other live: nothing to wait for


def test_a_class_still_on_its_first_replays_is_live_by_its_claims_before_it_matches_anything():
    """docs/protocol.md §10.1 (r30), the devnet that lost a two-class step: the CPU's first match
    arrived while the GPU nodes' first replays were still in flight; the GPU had matched nothing,
    so it was not live, and a CPU node took at once the last slot of the step the CPU had matched.
    A class a live claim names is live; with no turnaround of its own yet it is taken to be as
    fast as the planning node's class, so the step waits CLASS_WAIT of those — and when its
    claims' leases end with nothing matched, nothing waits for it."""
    gpu, cpu = "cuda/sm_90", "cpu/x86_64"
    c1, g1 = bytes([1]) * 32, bytes([2]) * 32
    index = DeficitIndex(4, 2, now=0)
    index.add_claim(0, c1, 0, 600, device=cpu)
    index.add_claim(1, g1, 2, 100, device=gpu)  # the GPU's first replay, in flight
    index.advance(9)
    index.add_attestation(0, c1, True, cpu, 1.0, post_state=b"P" * 32)  # the run's first match: 9 s, cold
    order = planner.StepOrder(b"r" * 32, b"me", 4)

    def steps(device, now):
        index.advance(now)
        return {cand.step for cand in planner.plan(index, order, now=now, device=device, estimate_s=1, limit=4)}

    assert 0 not in steps(cpu, 10) and 0 in steps(gpu, 10)  # the CPU leaves step 0's last slot to the GPU
    assert 0 not in steps(cpu, 9 + 53) and 0 in steps(cpu, 9 + 54)  # for 6 x 9 s, the CPU's own turnaround
    late = DeficitIndex(4, 2, now=0)  # the GPU's claim ran out unmatched before the CPU matched: not live
    late.add_claim(1, g1, 2, 8, device=gpu)
    late.add_claim(0, c1, 0, 600, device=cpu)
    late.advance(9)
    late.add_attestation(0, c1, True, cpu, 1.0, post_state=b"P" * 32)
    assert 0 in {cand.step for cand in planner.plan(late, order, now=10, device=cpu, estimate_s=1, limit=4)}
