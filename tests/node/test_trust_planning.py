"""The daemon applies its trust policy twice: to the coverage it reports and to the planner that
picks steps to replay — so keys nobody trusts, and keys coverage has flagged, neither inflate
coverage nor make the node skip steps they claim to have covered."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from open1b.node import cli
from open1b.node.config import ConfigError, load_config
from open1b.node.doctor import run_checks
from open1b.node.ledger import Ledger
from open1b.node.views import coverage_json
from open1b.protocol import Attestation
from open1b.protocol.hashing import blake2b256
from tests.runs import attestation, run_manifest, witness_of

from .conftest import ident
from .fakes import make_ledger

NOW = int(time.time()) - 30
MANIFEST = run_manifest(ident(0), engine="test-engine", engine_version="1", model={"d": 1}, data={}, seed=0,
                              steps=4, state_hashes=[blake2b256(b"h", bytes([k])) for k in range(5)],
                              created_at=NOW - 100)


def att(signer: int, step: int, *, match: bool = True) -> Attestation:
    post = MANIFEST.state_hashes[step + 1] if match else blake2b256(b"wrong", bytes([step]))
    return attestation(ident(signer), run=MANIFEST.run_id, step=step, pre_state=MANIFEST.state_hashes[step],
                              post_state=post, verdict="match" if match else "mismatch", engine="test-engine",
                              engine_version="1", hardware="t", device="cpu/x86_64-avx2", elapsed_ms=1, issued_at=NOW)


def make_daemon(tmp_path: Path, **config) -> Ledger:
    return make_ledger(tmp_path / "node", MANIFEST, redundancy=2, **config)


def trusted(*signers: int) -> tuple[str, ...]:
    return tuple(ident(s).peer_id for s in signers)


def test_untrusted_keys_count_neither_in_coverage_nor_in_a_strict_planner(tmp_path):
    node = make_daemon(tmp_path, trusted_peers=trusted(1))  # the default planner is strict
    for k in range(4):
        node.statements.ingest_attestation(att(1, k).encoded)
        for sybil in range(20, 30):
            node.statements.ingest_attestation(att(sybil, k).encoded)
    cov = node.judge.coverage(MANIFEST.run_id)
    assert not cov.complete and all(s.auditors == (ident(1).peer_id,) for s in cov.steps)
    assert len(cov.untrusted) == 10
    index = node.planner.index(MANIFEST.run_id)
    assert all(index.attesters(k) == {ident(1).public_key} and index.deficit(k) == 1 for k in range(4))
    # `open` counts them all: the same statements, another policy
    open_node = make_daemon(tmp_path / "open", trust_policy="open")
    for a in node.store.attestations(MANIFEST.run_id):
        open_node.statements.ingest_attestation(a.encoded)
    assert open_node.judge.coverage(MANIFEST.run_id).complete


def test_with_plan_with_untrusted_a_step_complete_but_for_trust_is_not_replayed_again(tmp_path):
    """Issue 15: three nodes trusting only themselves replayed every step each (18 replays of 6
    steps). With ``plan_with_untrusted`` (off by default: fresh keys could withhold replays),
    untrusted matches fill the planner's deficit, never coverage; a flagged or disproved key fills
    nothing, and an untrusted mismatch still leaves the step wanted."""
    node = make_daemon(tmp_path, plan_with_untrusted=True)
    for k in range(3):
        for other in (20, 21):
            node.statements.ingest_attestation(att(other, k).encoded)
    node.statements.ingest_attestation(att(22, 3, match=False).encoded)
    index = node.planner.index(MANIFEST.run_id)
    assert [index.deficit(k) for k in range(3)] == [0, 0, 0] and index.deficit(3) > 0
    cov = node.judge.coverage(MANIFEST.run_id)
    assert all(s.status != "verified" for s in cov.steps) and len(cov.untrusted) == 3  # coverage counts none


def test_a_flagged_key_stops_counting_for_the_planner_too(tmp_path):
    node = make_daemon(tmp_path, trusted_peers=trusted(1, 2, 3, 4))
    for k in range(4):
        node.statements.ingest_attestation(att(4, k).encoded)  # the liar: matches everywhere
    node.statements.ingest_attestation(att(1, 1).encoded)
    node.planner.index(MANIFEST.run_id)  # built while the liar still counts
    assert node.planner.index(MANIFEST.run_id).deficit(0) == 1
    for honest in (2, 3):
        node.statements.ingest_attestation(att(honest, 2, match=False).encoded)  # step 2 is forged: two replays say so
    assert node.judge.refresh()
    assert node.counting.flagged[MANIFEST.run_id] == {ident(4).public_key}
    index = node.planner.index(MANIFEST.run_id)
    assert index.deficit(0) == 2 and index.attesters(1) == {ident(1).public_key}
    cov = node.judge.coverage(MANIFEST.run_id)
    assert cov.refuted_steps == [2] and [f.signer for f in cov.flagged] == [ident(4).peer_id]
    assert not node.judge.refresh()  # nothing new: nothing rebuilt


def test_own_attestations_always_count_for_planning(tmp_path):
    node = make_daemon(tmp_path, trust_policy="allowlist")
    mine = attestation(node.identity, **{f: getattr(att(1, 0), f) for f in Attestation.SCHEMA
                                                 if f not in ("signer",)})
    node.statements.ingest_attestation(mine.encoded)
    assert 0 in node.planner.index(MANIFEST.run_id).mine


def test_coverage_json_and_cli_show_policy_flags_and_untrusted_keys(tmp_path, monkeypatch, capsys):
    node = make_daemon(tmp_path, trusted_peers=trusted(1, 2, 3))
    for a in (att(1, 0), att(2, 0, match=False), att(3, 0, match=False), att(9, 1)):
        node.statements.ingest_attestation(a.encoded)
    view = coverage_json(node.judge.coverage(MANIFEST.run_id), MANIFEST)
    assert view["refuted_steps"] == [0] and view["policy"]["name"] == "allowlist"
    assert view["flagged"][0]["signer"] == ident(1).peer_id and view["untrusted"] == [ident(9).peer_id]
    assert len(view["per_step"][0]["evidence"]) == 2
    monkeypatch.setattr(cli, "_call", lambda args, path, shape, **kw: view)
    assert cli.main(["coverage", "abcd", "--api", "127.0.0.1:1"]) == 0
    out = capsys.readouterr().out
    assert "refuted [0]" in out and f"flagged {ident(1).peer_id} at step 0" in out and "1 untrusted" in out
    assert cli.main(["coverage", "abcd", "--api", "127.0.0.1:1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == view


def test_trust_config_keys(tmp_path):
    (tmp_path / "config.toml").write_text(
        f'[node]\ntrust_policy = "open"\ntrusted_peers = ["{ident(1).peer_id}"]\ndispute_quorum = 3\n')
    config = load_config(tmp_path)
    assert config.trust(b"k" * 32).name == "open" and config.trust(b"k" * 32).quorum == 3
    assert config.trust(b"k" * 32).roots == {b"k" * 32, ident(1).public_key}
    for bad in ('trust_policy = "everyone"', 'trusted_peers = ["QmNotAnEd25519Peer"]', "dispute_quorum = 1"):
        (tmp_path / "config.toml").write_text(f"[node]\n{bad}\n")
        with pytest.raises(ConfigError):
            load_config(tmp_path)


def test_per_run_step_metrics_follow_coverage(tmp_path):
    from open1b.node.metrics import Gauges, metrics_registry, render

    node = make_daemon(tmp_path, trusted_peers=trusted(1, 2, 3))
    for a in (att(1, 0), att(2, 1), att(3, 1, match=False), att(2, 2, match=False), att(3, 2, match=False)):
        node.statements.ingest_attestation(a.encoded)
    node.judge.refresh()
    text = render(metrics_registry(node.statements.stats, lambda: Gauges(0, 0, 0, 1))).decode()
    run = MANIFEST.run_id.hex()
    for status, n in (("verified", 1), ("disputed", 1), ("refuted", 1)):
        assert f'open1b_run_steps{{run="{run}",status="{status}"}} {n}.0' in text, text


def test_a_key_earns_trust_from_the_store_without_a_restart_and_the_planner_counts_it(tmp_path, monkeypatch, capsys):
    """docs/protocol.md §8.1.1: three proven matches of steps this node replayed, on its own run,
    earn the key; coverage, the planner and `coverage`'s text follow at the next judgement. With
    ``earn_trust = false`` the same statements earn nothing."""
    run = MANIFEST.run_id
    nodes = {on: make_ledger(tmp_path / str(on), MANIFEST, identity=ident(0), redundancy=2, earn_trust=on)
             for on in (True, False)}
    for node in nodes.values():
        for k in range(3):
            node.proof.replayed(MANIFEST, k, MANIFEST.state_hashes[k + 1], witness_of(k))
            node.statements.add_own(att(0, k))
        for k in range(4):
            node.statements.ingest_attestation(att(2, k).encoded)
        assert node.judge.coverage(run).untrusted == (ident(2).peer_id,)
        assert node.planner.index(run).deficit(0) == 1
    assert nodes[True].judge.refresh() and not nodes[False].judge.refresh()
    node = nodes[True]
    assert [p.step for p in node.counting.earned[ident(2).public_key]] == [0, 1, 2]
    cov = node.judge.coverage(run)
    assert cov.untrusted == () and [len(s.auditors) for s in cov.steps] == [2, 2, 2, 1]
    index = node.planner.index(run)
    assert [index.deficit(k) for k in range(4)] == [0, 0, 0, 1]
    assert nodes[False].judge.coverage(run).untrusted == (ident(2).peer_id,) and not nodes[False].counting.earned
    view = coverage_json(cov, MANIFEST, node.counting.earned)
    assert view["policy"]["earned"] == [ident(2).peer_id] and ident(0).peer_id in view["policy"]["roots"]
    monkeypatch.setattr(cli, "_call", lambda args, path, shape, **kw: view)
    assert cli.main(["coverage", "abcd", "--api", "127.0.0.1:1"]) == 0
    assert "1 listed keys, 1 earned" in capsys.readouterr().out
    checks = [c for c in run_checks(tmp_path, None, "cpu", coverages=[view]) if c.name == "trust"]
    assert [c.level for c in checks] == ["OK"] and "1 listed and 1 earned keys counted" in checks[0].detail
