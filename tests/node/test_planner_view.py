"""The planner's view (node/planner_view.py) follows statements and changes of what counts one at
a time, and always equals a view built afresh from the store under the counting of the moment."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from open1b.node import planner
from open1b.node.planner_view import PlannerView
from open1b.protocol import Claim, WitnessReveal
from open1b.protocol.hashing import blake2b256
from tests.runs import attestation, run_manifest, witness_of

from .conftest import ident
from .fakes import FrozenClock, make_ledger

T0 = 1_800_000_000
STEPS = 4
ME, SIGNERS = 0, (1, 2, 3, 4, 5)
LISTED = (1, 2, 3)  # with ME, the operator's list; 4 and 5 count only if they earn trust
MANIFEST = run_manifest(ident(9), engine="test-engine", engine_version="1", model={"d": 1}, data={}, seed=0,
                        steps=STEPS, state_hashes=[blake2b256(b"h", bytes([k])) for k in range(STEPS + 1)],
                        created_at=T0 - 100)


DEVICES = ("cpu/x86_64-avx2", "cuda/sm_90")  # two classes, so the view's class sets are tested too


def _att(signer: int, step: int, match: bool, honest: bool):
    post = MANIFEST.state_hashes[step + 1] if match else blake2b256(b"wrong", bytes([step]))
    extra = {} if honest else {"witness": b"\x04" * 32}  # a copier's made-up binding
    return attestation(ident(signer), run=MANIFEST.run_id, step=step, pre_state=MANIFEST.state_hashes[step],
                       post_state=post, verdict="match" if match else "mismatch", engine="test-engine",
                       engine_version="1", hardware="t", device=DEVICES[signer % 2], elapsed_ms=1000 * (signer + 1),
                       issued_at=T0, **extra)


# Signed once, drawn by index: hypothesis then shrinks over plain tuples.
ATTS = {(s, k, m, h): _att(s, k, m, h) for s in (ME, *SIGNERS) for k in range(STEPS) for m in (True, False)
        for h in (True, False)}
REVEALS = {k: WitnessReveal.create(ident(8), run=MANIFEST.run_id, step=k, witness=witness_of(k), issued_at=T0)
           for k in range(STEPS)}
CLAIMS = {(c, k): Claim.create(ident(c), run=MANIFEST.run_id, step=k, slot=0, issued_at=T0 - 10, lease_expiry=T0 + 60,
                               expected_done=T0 + 100 * c)
          for c in SIGNERS for k in range(STEPS)}

keys = st.frozensets(st.sampled_from(SIGNERS))
step = st.integers(0, STEPS - 1)
event = st.one_of(
    st.tuples(st.just("attest"), st.sampled_from((ME, *SIGNERS)), step, st.booleans(), st.booleans()),
    st.tuples(st.just("claim"), st.sampled_from(SIGNERS), step),
    st.tuples(st.just("reveal"), step),
    st.tuples(st.just("flag"), keys),
    st.tuples(st.just("earn"), keys),
    st.tuples(st.just("look"),),  # the planner reads the run: its index is built now, if not before
)


def _state(view: PlannerView):
    index = view.index(MANIFEST.run_id)
    return ([index.state(k) for k in range(STEPS)], [index.bucket(k) for k in range(STEPS)], index.mine,
            index.open_buckets(), index.tail(), [index.straggling(k) for k in range(STEPS)],
            [set(index.matched_by(d)) for d in DEVICES])


@settings(max_examples=60, deadline=None)
@given(history=st.lists(event, max_size=30), plan_with_untrusted=st.booleans())
def test_the_view_told_each_change_equals_one_built_afresh(history, plan_with_untrusted):
    with tempfile.TemporaryDirectory() as tmp:
        ledger = make_ledger(Path(tmp), MANIFEST, identity=ident(ME), clock=FrozenClock(T0), redundancy=2,
                             trust_policy="allowlist", trusted_peers=tuple(ident(s).peer_id for s in LISTED),
                             plan_with_untrusted=plan_with_untrusted)
        run, counting, statements = MANIFEST.run_id, ledger.counting, ledger.statements

        def tell(recount):
            if recount is not None:
                ledger.planner.recount(recount)

        for kind, *args in history:
            if kind == "attest":
                statements.add_own(ATTS[tuple(args)])
            elif kind == "claim":
                statements.add_claim(CLAIMS[tuple(args)])
            elif kind == "reveal":
                statements.add_own(REVEALS[args[0]])
            elif kind == "flag":  # as the judge does: set in the counting, the change told to the view
                tell(counting.set_flagged(run, frozenset(ident(s).public_key for s in args[0])))
            elif kind == "earn":
                tell(counting.set_earned({ident(s).public_key: () for s in args[0]}))
            else:
                ledger.planner.index(run)
        afresh = PlannerView(ident(ME).public_key, 2, ledger.manifests, ledger.store, counting,
                             clock=lambda: T0)
        assert _state(ledger.planner) == _state(afresh)
        ledger.store.close()


def test_a_flag_removes_a_keys_attestations_and_clearing_it_brings_them_back(tmp_path):
    ledger = make_ledger(tmp_path, MANIFEST, identity=ident(ME), clock=FrozenClock(T0), redundancy=2,
                         trust_policy="allowlist", trusted_peers=(ident(1).peer_id, ident(2).peer_id))
    run = MANIFEST.run_id
    for signer in (1, 2):
        ledger.statements.add_own(ATTS[(signer, 0, True, True)])
    ledger.statements.add_own(ATTS[(2, 1, False, True)])
    index = ledger.planner.index(run)
    assert index.deficit(0) == 0 and index.disputed(1)
    ledger.planner.recount(ledger.counting.set_flagged(run, frozenset({ident(2).public_key})))
    assert index.attesters(0) == {ident(1).public_key} and not index.disputed(1)  # the same index, updated
    assert ledger.planner.index(run) is index
    ledger.planner.recount(ledger.counting.set_flagged(run, frozenset()))
    assert index.deficit(0) == 0 and index.disputed(1)


def test_an_uncounted_signature_frees_its_claimants_slot(tmp_path):
    """A key whose attestation does not count (here: untrusted) is finished with the step all the
    same — a node never attests a step twice — so its live claim holds no slot: the step wants
    as many attesters as before, and the claimant's slot may be taken at once, not when its
    lease runs out."""
    ledger = make_ledger(tmp_path, MANIFEST, identity=ident(ME), clock=FrozenClock(T0), redundancy=2,
                         trust_policy="allowlist", trusted_peers=tuple(ident(s).peer_id for s in LISTED))
    run, stranger = MANIFEST.run_id, ident(4).public_key
    ledger.statements.add_claim(CLAIMS[(4, 0)])
    index = ledger.planner.index(run)
    assert index.deficit(0) == 1  # a live claim by a node that has not attested: busy
    ledger.statements.add_own(ATTS[(4, 0, True, True)])
    assert index.deficit(0) == 2 and index.attesters(0) == frozenset()
    cand = next(c for c in planner.pick(index, ledger.planner.order(run), limit=STEPS) if c.step == 0)
    assert cand.finished == {stranger} and cand.attesters == frozenset()
    assert planner.free_slot({0: CLAIMS[(4, 0)]}, 1, me=ident(ME).public_key, attesters=cand.done(), now=T0) == 0
    afresh = PlannerView(ident(ME).public_key, 2, ledger.manifests, ledger.store, ledger.counting, clock=lambda: T0)
    assert _state(afresh) == _state(ledger.planner)
    ledger.store.close()
