"""The node's side of the proof of replay (node/replay_proof.py, the store's reveal tables, sync)."""

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap

import trio

from open1b.node.replay_proof import ReplayProof
from open1b.node.store import Store
from open1b.node.sync import pull_attestations, serve_sync
from open1b.protocol import MATCH, Attestation, WitnessReveal, coverage, validate_reveal, witness_binding
from tests.runs import attestation, witness_of

from .conftest import ident

NOW = 1_800_000_000
ME, HONEST, COPIER, STRANGER = 1, 2, 3, 4


def _att(manifest, signer: int, step: int, **changes) -> Attestation:
    fields = dict(run=manifest.run_id, step=step, pre_state=manifest.state_hashes[step],
                  post_state=manifest.state_hashes[step + 1], verdict=MATCH, engine=manifest.engine,
                  engine_version=manifest.engine_version, hardware="t", device="cpu/x86_64-avx2", elapsed_ms=1, issued_at=NOW)
    fields.update(changes)
    return attestation(ident(signer), **fields)


def _copy(source: Attestation, copier: int) -> Attestation:
    fields = {f.name: getattr(source, f.name) for f in dataclasses.fields(source) if f.name not in ("sig", "signer")}
    return Attestation.create(ident(copier), **fields)


def _proof(store: Store, trusted=(ME, HONEST, COPIER)) -> ReplayProof:
    from open1b.node.counting import Counting
    from open1b.protocol import TrustPolicy
    from open1b.protocol.coverage import ALLOWLIST

    keys = frozenset(ident(n).public_key for n in trusted)
    return ReplayProof(ident(ME), store, Counting(ident(ME).public_key, TrustPolicy(ALLOWLIST, keys), store))


def test_a_copy_seen_after_our_replay_is_revealed_once(tmp_path, manifest):
    store = Store(tmp_path / "s.sqlite")
    proof = _proof(store)
    proof.replayed(manifest, 2, manifest.state_hashes[3], witness_of(2))
    honest = _att(manifest, HONEST, 2)
    for att in (honest, _copy(honest, COPIER), _copy(honest, COPIER)):
        store.add_attestation(att)
        proof.check(att)
    [reveal] = proof.due(NOW)
    assert (reveal.run, reveal.step, reveal.witness, reveal.revealer) == (manifest.run_id, 2, witness_of(2),
                                                                          ident(ME).public_key)
    assert validate_reveal(reveal.encoded, {manifest.run_id: manifest}.get, NOW).accepted
    assert store.reveals(manifest.run_id) == []  # signed, not stored: the outbox stores it, then gossips it
    store.add_reveal(reveal)
    proof.check(_copy(honest, COPIER))
    assert proof.due(NOW + 1) == []  # a reveal of the step is held: once is enough
    cov = coverage(manifest, store.attestations(manifest.run_id), reveals=store.reveals(manifest.run_id))
    assert [(f.signer, f.kind) for f in cov.flagged] == [(ident(COPIER).peer_id, "copier")]


def test_copies_held_before_our_replay_are_checked_when_it_ends(tmp_path, manifest):
    store = Store(tmp_path / "s.sqlite")
    proof = _proof(store)
    store.add_attestation(_copy(_att(manifest, HONEST, 1), COPIER))
    proof.replayed(manifest, 1, manifest.state_hashes[2], witness_of(1))
    assert [r.step for r in proof.due(NOW)] == [1]


def test_nothing_is_revealed_for_honest_bindings_mismatches_or_keys_we_do_not_count(tmp_path, manifest):
    store = Store(tmp_path / "s.sqlite")
    proof = _proof(store)
    proof.replayed(manifest, 3, manifest.state_hashes[4], witness_of(3))
    made_up = b"\x01" * 32
    for att in (_att(manifest, HONEST, 3),  # an honest binding
                _att(manifest, COPIER, 3, post_state=b"\x02" * 32, verdict="mismatch", witness=made_up),
                _att(manifest, STRANGER, 3, witness=made_up)):  # a key our policy does not count
        store.add_attestation(att)
        proof.check(att)
    assert proof.due(NOW) == [] and proof.revealed == 0


def test_only_a_witness_that_opens_the_commitment_is_kept(tmp_path, manifest):
    store = Store(tmp_path / "s.sqlite")
    proof = _proof(store)
    proof.replayed(manifest, 0, manifest.state_hashes[1], b"\x09" * 32)  # the states agree, the witness does not
    proof.replayed(manifest, 1, b"\x07" * 32, witness_of(1))  # a mismatch
    assert proof.known(manifest.run_id) == {} and proof.commitment_mismatches == 1
    proof.check(_att(manifest, COPIER, 0, witness=b"\x03" * 32))
    assert proof.due(NOW) == []


def test_witnesses_and_reveals_survive_a_restart(tmp_path, manifest):
    store = Store(tmp_path / "s.sqlite")
    _proof(store).replayed(manifest, 4, manifest.state_hashes[5], witness_of(4))
    reveal = WitnessReveal.create(ident(HONEST), run=manifest.run_id, step=5, witness=witness_of(5), issued_at=NOW)
    assert store.add_reveal(reveal) and not store.add_reveal(reveal)
    store.close()
    again = Store(tmp_path / "s.sqlite")
    proof = _proof(again)
    assert proof.known(manifest.run_id) == {4: witness_of(4)}
    assert again.reveals(manifest.run_id) == [reveal] and again.reveals(manifest.run_id, 4) == []
    proof.check(_copy(_att(manifest, HONEST, 4), COPIER))
    assert [r.step for r in proof.due(NOW)] == [4]


def test_kill_9_loses_no_committed_reveal(tmp_path, manifest):
    writer = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from open1b.node.store import Store
        from open1b.protocol import WitnessReveal
        from open1b.protocol.hashing import blake2b256
        from open1b.protocol import Identity
        from tests.runs import witness_of
        store = Store(Path({str(tmp_path / 's.sqlite')!r}))
        run = bytes.fromhex({manifest.run_id.hex()!r})
        for i in range(10_000):
            who = Identity(blake2b256(b"reveal-writer", i.to_bytes(4, "little")))
            r = WitnessReveal.create(who, run=run, step=i % 6, witness=witness_of(i % 6), issued_at=i)
            store.add_reveal(r)
            print(r.digest.hex(), flush=True)   # acknowledged only after the commit returned
            time.sleep(0.002)
    """)
    proc = subprocess.Popen([sys.executable, "-c", writer], stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    acked = [proc.stdout.readline().strip() for _ in range(50)]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    kept = {r.digest.hex() for r in Store(tmp_path / "s.sqlite").reveals(manifest.run_id)}
    assert set(acked) <= kept


class _Pipe:
    """Both ends of one in-memory stream: what one side sends, the other receives."""

    peer_id = "the-peer"

    def __init__(self) -> None:
        self.frames: list[bytes] = []

    async def send(self, frame: bytes) -> None:
        self.frames.append(frame)

    async def receive(self, limit: int) -> bytes:
        frame = self.frames.pop(0)
        assert len(frame) <= limit
        return frame

    async def close(self) -> None:
        pass


def test_sync_serves_reveals_beside_attestations(manifest):
    from open1b.protocol.codec import encode

    att = _att(manifest, HONEST, 0)
    reveal = WitnessReveal.create(ident(HONEST), run=manifest.run_id, step=0, witness=witness_of(0), issued_at=NOW)
    served = _Pipe()
    served.frames.append(encode({"run": manifest.run_id}))
    trio.run(serve_sync, served, lambda run: [att, reveal] if run == manifest.run_id else None)
    answer = served.frames  # the request was consumed; what remains is the response

    class _P2P:
        async def open_stream(self, peer_id, protocol, *older):
            stream = _Pipe()
            stream.frames = list(answer)
            stream.send = lambda frame: trio.sleep(0)  # the request goes nowhere
            return stream

    got: list[bytes] = []
    async def ingest(frames):
        got.extend(frames)
        return len(frames)

    new = trio.run(pull_attestations, _P2P(), "peer", manifest.run_id, ingest)
    assert new == 2 and got == [att.encoded, reveal.encoded]
    assert witness_binding(manifest.run_id, 0, att.signer, reveal.witness) == att.witness


# -- the daemon: gossip and sync ingestion, publishing reveals, coverage with copier flags --------
def test_daemon_reveals_a_copy_and_its_coverage_flags_the_copier(tmp_path, manifest, monkeypatch, capsys):

    from open1b.node import cli
    from open1b.node.topics import reveals_topic
    from open1b.node.views import coverage_json

    from .fakes import FakeGossip, FrozenClock, make_ledger

    # the manifest is dated NOW; the node's clock must not find our statements in the future
    peers = (HONEST, COPIER)
    gossip = FakeGossip()
    node = make_ledger(tmp_path / "node", manifest, identity=ident(ME), clock=FrozenClock(NOW + 60), gossip=gossip,
                       redundancy=1, trusted_peers=tuple(ident(p).peer_id for p in peers))
    node.proof.replayed(manifest, 1, manifest.state_hashes[2], witness_of(1))  # as after our own replay
    honest = _att(manifest, HONEST, 1)
    copied = _copy(honest, COPIER)
    assert trio.run(node.statements.ingest_synced, [honest.encoded, copied.encoded], "peer") == 2
    async def publish_due_reveals():
        for due in node.proof.due(NOW + 60):
            await node.outbox.publish(due)

    trio.run(publish_due_reveals)
    [(topic, data)] = gossip.published
    assert topic == reveals_topic(manifest.run_id) and WitnessReveal.decode(data).step == 1
    assert node.judge.refresh() and node.counting.flagged[manifest.run_id] == {ident(COPIER).public_key}
    assert node.counting.plans_with(honest) and not node.counting.plans_with(copied)  # the planner stops counting it too
    assert node.planner.index(manifest.run_id).attesters(1) == {ident(HONEST).public_key}

    view = coverage_json(node.judge.coverage(manifest.run_id), manifest)
    [flag] = view["flagged"]
    assert flag == {"signer": ident(COPIER).peer_id, "step": 1, "kind": "copier", "statement": copied.digest.hex(),
                    "conflicting": honest.digest.hex(), "reveal": WitnessReveal.decode(data).digest.hex()}
    assert view["per_step"][1]["auditors"] == [ident(HONEST).peer_id]
    monkeypatch.setattr(cli, "_call", lambda args, path, shape, **kw: view)
    assert cli.main(["coverage", "abcd", "--api", "127.0.0.1:1"]) == 0
    assert f"flagged {ident(COPIER).peer_id} at step 1 as a copier" in capsys.readouterr().out

    # a reveal arriving by sync is judged like one on gossip: a wrong witness is the sender's fault
    bad = WitnessReveal.create(ident(HONEST), run=manifest.run_id, step=2, witness=witness_of(3), issued_at=NOW)
    assert trio.run(node.statements.ingest_synced, [bad.encoded], "liar") == 0 and gossip.penalised == ["liar"]
    assert node.statements.validation["sync/reject/witness"] == 1
    assert node.statements.validator("reveal")("someone", data).value == "accept"
    assert node.statements.statements_for_sync(manifest.run_id)[-1].encoded == data  # served to late joiners


def test_daemon_planner_drops_a_match_a_peers_reveal_disproves(tmp_path, manifest):
    from .fakes import FrozenClock, make_ledger

    node = make_ledger(tmp_path / "node", manifest, clock=FrozenClock(NOW + 60), redundancy=1,
                       trusted_peers=(ident(COPIER).peer_id,))
    lazy = _att(manifest, COPIER, 2, witness=b"\x04" * 32)  # a made-up binding
    assert node.statements.ingest_attestation(lazy.encoded)
    assert node.planner.index(manifest.run_id).deficit(2) == 0  # it fills step 2's redundancy of 1
    reveal = WitnessReveal.create(ident(STRANGER), run=manifest.run_id, step=2, witness=witness_of(2), issued_at=NOW)
    assert node.statements.ingest_reveal(reveal.encoded)
    assert node.planner.index(manifest.run_id).deficit(2) == 1  # so the step is replayed again
    cov = node.judge.coverage(manifest.run_id)
    assert cov.flagged == () and cov.steps[2].auditors == ()  # unproven, not (yet) flagged: nobody bound W_2


def test_the_reveal_route_signs_checks_stores_and_gossips_a_trainers_witness(tmp_path, manifest):
    import pytest

    from open1b.node.api import ApiError
    from open1b.node.api_routes import make_reveal
    from open1b.node.topics import reveals_topic

    from .fakes import FakeGossip, FrozenClock, make_ledger

    gossip = FakeGossip()
    node = make_ledger(tmp_path / "node", manifest, clock=FrozenClock(NOW + 60), gossip=gossip, redundancy=1,
                       trusted_peers=(ident(COPIER).peer_id,))

    def reveal(step, witness):
        return trio.run(make_reveal, node.identity, node.manifests, node.outbox, node.statements.clock, manifest.run_id,
                        step, witness)

    lazy = _att(manifest, COPIER, 3, witness=b"\x04" * 32)
    node.statements.ingest_attestation(lazy.encoded)
    made = reveal(3, witness_of(3))
    assert made["step"] == 3 and made["revealer"] == node.identity.peer_id
    assert gossip.published[0][0] == reveals_topic(manifest.run_id)
    assert node.planner.index(manifest.run_id).deficit(3) == 1  # the lazy match no longer fills step 3
    with pytest.raises(ApiError, match="not a valid reveal"):
        reveal(3, witness_of(2))


def test_cli_reveal_recomputes_a_witness_by_replay_and_posts_it(tampered_run, monkeypatch):
    from open1b.node import cli
    from open1b.protocol.witness import witness_commitment

    run_dir, manifest = tampered_run
    posted = []
    monkeypatch.setattr(cli, "_call", lambda args, path, shape, **kw: posted.append((path, kw)) or {
        "step": 1, "witness": path.rsplit("=", 1)[1], "digest": "00" * 32})
    assert cli.main(["reveal", str(run_dir), "--step", "1", "--api", "127.0.0.1:1"]) == 0
    [(path, kw)] = posted
    assert path.startswith(f"/v1/reveal/{manifest.run_id.hex()}?step=1&witness=") and kw == {"method": "POST"}
    assert witness_commitment(bytes.fromhex(path.rsplit("=", 1)[1])) == manifest.witnesses[1]
    # step 2's state was forged *after* the step: its forward and backward, and so its witness, are honest
    assert cli.main(["reveal", str(run_dir), "--step", "2", "--api", "127.0.0.1:1"]) == 0
