"""Earned trust (docs/protocol.md §8.1.1): each condition failing on its own keeps a key out, and the
receipt order that makes a match a proof of replay is the store's."""

from __future__ import annotations

import time

from open1b.node.earned_trust import EarnRule, Pair, RunEvidence, earned_keys, evidence_from_store
from open1b.node.store import Store
from open1b.protocol import Conviction, WitnessReveal
from open1b.protocol.hashing import blake2b256
from open1b.protocol.identity import public_key_from_peer_id
from tests.runs import attestation, run_manifest, witness_of

from .conftest import ident

NOW = int(time.time()) - 30
ME, LISTED, K, SYBIL = 0, 1, 2, 3  # this node, a trusted_peers key, the candidate, another key
PUB_A, PUB_B = 5, 6  # publishers that are not roots
ROOTS = frozenset({ident(ME).public_key, ident(LISTED).public_key})
KEY = ident(K).public_key


def manifest(publisher: int, steps: int = 4, tag: int = 0):
    return run_manifest(ident(publisher), engine="test-engine", engine_version="1", model={"d": 1}, data={},
                        seed=tag, steps=steps, state_hashes=[blake2b256(b"h", bytes([tag, k])) for k in range(steps + 1)],
                        created_at=NOW - 100)


def att(m, signer: int, step: int, *, match: bool = True, witness: bytes | None = None):
    post = m.state_hashes[step + 1] if match else blake2b256(b"wrong", bytes([step]))
    extra = {} if witness is None else {"witness": witness}
    return attestation(ident(signer), run=m.run_id, step=step, pre_state=m.state_hashes[step], post_state=post,
                       verdict="match" if match else "mismatch", engine="test-engine", engine_version="1",
                       hardware="t", device="cpu/x86_64-avx2", elapsed_ms=1, issued_at=NOW, **extra)


def replayed(m, steps, *, root: int = ME, k_steps=None, own=True, extra=()):
    """A run whose ``steps`` ``root`` replayed (with this node's own witnesses if ``own``) and K
    matched (``k_steps``, default the same steps), each received in that order."""
    atts = [att(m, root, s) for s in steps] + [att(m, K, s) for s in (steps if k_steps is None else k_steps)]
    atts += list(extra)
    return RunEvidence(m, [(a, i + 1) for i, a in enumerate(atts)], (),
                       {s: witness_of(s) for s in steps} if own else {})


def earned(*runs, rule=EarnRule()):
    return earned_keys(runs, roots=ROOTS, quorum=2, rule=rule)


def test_three_proven_matches_on_a_roots_run_earn_with_their_pairs_as_evidence():
    m = manifest(ME)
    got = earned(replayed(m, [0, 1, 2]))
    assert got == {KEY: tuple(Pair(m.run_id, s, ident(ME).public_key) for s in (0, 1, 2))}


def test_a_listed_peer_vouches_like_the_node_itself_and_its_run_counts_as_a_roots():
    # the node did not replay: it knows W_k from reveals stored after K's matches
    m = manifest(LISTED)
    atts = [att(m, LISTED, s) for s in (0, 1, 2)] + [att(m, K, s) for s in (0, 1, 2)]
    reveals = [(WitnessReveal.create(ident(SYBIL), run=m.run_id, step=s, witness=witness_of(s), issued_at=NOW), 6)
               for s in (0, 1, 2)]
    assert KEY in earned(RunEvidence(m, [(a, i + 1) for i, a in enumerate(atts)], reveals))


def test_fewer_than_k_pairs_do_not_earn():
    assert earned(replayed(manifest(ME), [0, 1])) == {}
    assert KEY in earned(replayed(manifest(ME), [0, 1]), rule=EarnRule(matches=2))


def test_a_match_that_does_not_bind_the_witness_does_not_count():
    m = manifest(ME)
    bad = att(m, K, 2, witness=b"\x00" * 32)
    ev = replayed(m, [0, 1, 2], k_steps=[0, 1], extra=[bad])
    assert earned(ev) == {}


def test_without_the_witness_known_a_match_proves_nothing():
    # (a): no own replay of the steps and no reveal: the node cannot check the bindings
    assert earned(replayed(manifest(ME), [0, 1, 2], own=False)) == {}


def test_only_matches_stored_before_the_first_reveal_count():
    m = manifest(ME)
    atts = [att(m, ME, s) for s in (0, 1, 2)] + [att(m, K, s) for s in (0, 1, 2)]
    seq = [(a, i + 1) for i, a in enumerate(atts)]  # K's matches are 4, 5, 6

    def reveals(before):
        return [(WitnessReveal.create(ident(SYBIL), run=m.run_id, step=s, witness=witness_of(s), issued_at=NOW), before)
                for s in (0, 1, 2)]

    assert KEY in earned(RunEvidence(m, seq, reveals(6)))  # every match of K arrived before the reveals
    assert earned(RunEvidence(m, seq, reveals(5))) == {}  # step 2's match is a copy stored after its reveal
    # Our own replay knew W_k too, but once a reveal was stored a later match may be a copy of it.
    assert earned(RunEvidence(m, seq, reveals(5), {s: witness_of(s) for s in (0, 1, 2)})) == {}


def test_a_root_must_have_proven_the_same_step():
    m = manifest(ME)
    ev = replayed(m, [0, 1], k_steps=[0, 1, 2])
    ev = RunEvidence(m, ev.attestations, (), {s: witness_of(s) for s in (0, 1, 2)})  # we know W_2 but matched only 0, 1
    assert earned(ev) == {}
    # a root's match that does not bind W_2 is not a proof that the root replayed it either
    unbound = att(m, LISTED, 2, witness=b"\x01" * 32)
    assert earned(RunEvidence(m, [*ev.attestations, (unbound, 99)], (), ev.own_witnesses)) == {}


def test_one_publisher_that_is_not_a_root_is_not_enough():
    a, b = manifest(PUB_A, tag=1), manifest(PUB_B, tag=2)
    assert earned(replayed(a, [0, 1, 2, 3])) == {}  # PUB_A knows every W_k of its run: it could have told K
    got = earned(replayed(a, [0, 1]), replayed(b, [0]))
    assert sorted({p.publisher for p in got[KEY]}) == sorted([ident(PUB_A).public_key, ident(PUB_B).public_key])
    assert earned(replayed(a, [0, 1]), replayed(b, [0]), rule=EarnRule(publishers=3)) == {}


def test_a_publishers_key_never_earns_on_its_own_runs():
    own_run = manifest(K, tag=3)
    assert earned(replayed(own_run, [0, 1, 2, 3])) == {}
    # with another run's pairs it earns from those alone
    other = manifest(ME, tag=4)
    assert {p.run for p in earned(replayed(own_run, [0, 1, 2, 3]), replayed(other, [0, 1, 2]))[KEY]} == {other.run_id}


def test_a_key_flagged_in_any_run_never_earns():
    good, other = manifest(ME, tag=5), manifest(ME, tag=6)
    honest = replayed(good, [0, 1, 2])
    assert KEY in earned(honest, replayed(other, [0]))
    # K contradicts a root on another run's step
    lie = RunEvidence(other, [(att(other, ME, 0), 1), (att(other, K, 0, match=False), 2)], (), {0: witness_of(0)})
    assert earned(honest, lie) == {}
    # K signs two results of one step (flagged by §8.3 with K counted, even where no root replayed)
    twice = RunEvidence(other, [(att(other, K, 3), 1), (att(other, K, 3, match=False), 2)])
    assert earned(honest, twice) == {}
    # K copies a step this node replayed (its match binds another witness than our own W_1)
    copy = RunEvidence(other, [(att(other, K, 1, witness=b"\x02" * 32), 1)], (), {1: witness_of(1)})
    assert earned(honest, copy) == {}
    # a fraud proof the node keeps convicts K's trace of a step, whether or not K attested in the run
    for atts in ([(att(other, K, 2, match=False), 1)], []):
        convicted = RunEvidence(other, atts, (), {}, [Conviction(other.run_id, 2, KEY, other.state_hashes[2],
                                                                 b"\x09" * 32, b"\x07" * 32)])
        assert earned(honest, convicted) == {}
    # another key's conviction, or one from another state than the run's, disqualifies nobody
    for guilty, pre in ((ident(SYBIL).public_key, other.state_hashes[2]), (KEY, b"\x08" * 32)):
        elsewhere = RunEvidence(other, [], (), {}, [Conviction(other.run_id, 2, guilty, pre, b"\x09" * 32, b"\x07" * 32)])
        assert KEY in earned(honest, elsewhere)


def test_earned_keys_vouch_for_nobody():
    m = manifest(ME, tag=7)
    ev = replayed(m, [0, 1, 2], extra=[att(m, SYBIL, s) for s in (0, 1, 2)])
    got = earned(ev)
    assert set(got) == {KEY, ident(SYBIL).public_key}  # both proved against the node's own replays
    # Without a root's match of the steps, K's matches vouch for SYBIL's no more than the reverse.
    ev = RunEvidence(m, [(att(m, K, s), s + 1) for s in (0, 1, 2)] + [(att(m, SYBIL, s), s + 9) for s in (0, 1, 2)],
                     (), {s: witness_of(s) for s in (0, 1, 2)})
    assert earned(ev) == {}


def test_the_store_orders_reveals_after_the_attestations_received_before_them(tmp_path):
    m = manifest(ME, tag=8)
    store = Store(tmp_path / "store.sqlite")
    for s in (0, 1, 2):
        store.add_attestation(att(m, ME, s))
    store.add_attestation(att(m, K, 0))
    store.add_attestation(att(m, K, 1))
    for s in (0, 1, 2):
        store.add_reveal(WitnessReveal.create(ident(SYBIL), run=m.run_id, step=s, witness=witness_of(s), issued_at=NOW))
    store.add_attestation(att(m, K, 2))  # after the reveal of its step: may be a copy
    assert earned(*evidence_from_store(store, [m])) == {}
    assert [p.step for p in earned(*evidence_from_store(store, [m]), rule=EarnRule(matches=2))[KEY]] == [0, 1]


def test_the_daemons_incremental_view_equals_the_rule_over_the_whole_store(tmp_path):
    from open1b.node.earned_trust import EarnedTrust

    a, b = manifest(ME, tag=9), manifest(PUB_A, tag=10)
    store = Store(tmp_path / "store.sqlite")
    view = EarnedTrust(store, ROOTS, 2, EarnRule())
    assert view([a, b], []) == {}
    for s in (0, 1):
        store.add_replay_witness(a.run_id, s, witness_of(s))
        store.add_attestation(att(a, ME, s))
        store.add_attestation(att(a, K, s))
    assert view([a, b], [a.run_id]) == {}  # two pairs
    store.add_replay_witness(b.run_id, 0, witness_of(0))
    store.add_attestation(att(b, ME, 0))
    store.add_attestation(att(b, K, 0))
    got = view([a, b], [b.run_id])
    assert got == earned(*evidence_from_store(store, [a, b])) and len(got[KEY]) == 3
    store.add_attestation(att(b, K, 2, match=False))  # a lone mismatch where no root replayed: no proof of a lie
    assert view([a, b], [b.run_id]) == got
    store.add_attestation(att(b, ME, 2))  # a root reported step 2 otherwise: K is disqualified
    assert view([a, b], [b.run_id]) == {} == earned(*evidence_from_store(store, [a, b]))


def test_trust_list_reads_a_store_the_daemon_has_not_migrated_as_the_daemon_will_and_writes_nothing(tmp_path, capsys):
    """``open1b-node trust list`` opens the store read only (node/cli.py), also when the daemon
    of this version has not opened it yet: a store of the fraud proofs' layout before r25, and
    one whose reveals predate their receipt order. It reads each as the daemon reads it once
    migrated (a reveal without its order: no attestation counts as before it) and writes nothing."""
    import hashlib
    import json
    import shutil
    import sqlite3

    from open1b.node import cli as node_cli

    data_dir = tmp_path / "node"
    assert node_cli.main(["init", "--data-dir", str(data_dir)]) == 0
    assert node_cli.main(["trust", "add", "--data-dir", str(data_dir), ident(ME).peer_id]) == 0
    m = manifest(ME, tag=11)
    store = Store(tmp_path / "current.sqlite")
    store.add_manifest(m)
    for s in (0, 1, 2):
        store.add_replay_witness(m.run_id, s, witness_of(s))
        store.add_attestations([att(m, ME, s), att(m, K, s)])
    store.add_reveal(WitnessReveal.create(ident(SYBIL), run=m.run_id, step=0, witness=witness_of(0), issued_at=NOW))
    store.close()
    old_fraud = ("DROP TABLE fraud_proof_bodies; DROP TABLE fraud_convictions; CREATE TABLE fraud_proofs (run_id BLOB "
                 "NOT NULL, step INTEGER NOT NULL, guilty BLOB NOT NULL, encoded BLOB NOT NULL, PRIMARY KEY (run_id, step, guilty));")
    layouts = {"fraud before r25": (old_fraud, [KEY]),  # K matched before the reveal: earned
               "and reveals without their order": (old_fraud + "ALTER TABLE reveals DROP COLUMN attestations_before;", [])}
    path = data_dir / "store.sqlite"

    def earned_listed() -> list[bytes]:
        capsys.readouterr()
        assert node_cli.main(["trust", "list", "--data-dir", str(data_dir), "--json"]) == 0
        return [public_key_from_peer_id(e["peer_id"]) for e in json.loads(capsys.readouterr().out)["earned"]]

    for name, (downgrade, expected) in layouts.items():
        shutil.copy(tmp_path / "current.sqlite", path)
        with sqlite3.connect(path) as db:
            db.executescript(downgrade)
        db.close()
        before = hashlib.sha256(path.read_bytes()).digest()
        assert earned_listed() == expected, name
        assert hashlib.sha256(path.read_bytes()).digest() == before, name  # read only
        Store(path).close()  # the daemon opens it: migrated
        assert earned_listed() == expected, name
