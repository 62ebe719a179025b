"""Interop with a libp2p implementation we did not write: js-libp2p (from npm) beside open1b nodes.

* a small independent JS implementation of the wire format (js/open1b.mjs) passes our vectors;
* a js-libp2p peer joins a network of open1b-node daemon processes: it claims a step in the DHT
  (the auditor sees the claim and leaves that step alone), receives the auditor's attestations
  on gossip and decodes them exactly as we do, reads the auditor's claim record from the DHT,
  and publishes attestations of its own — the valid one is counted, the invalid ones rejected;
* claim arbitration stays right with a js-libp2p DHT server in the network, although it keeps
  the last record written rather than the one the protocol prefers.

Skipped only where Node.js is absent.
"""

from __future__ import annotations

import json
import subprocess
import time
from contextlib import AsyncExitStack

import pytest

from open1b.protocol import (
    Attestation,
    Claim,
    Identity,
    Outcome,
    blake2b256,
    claim_key,
    decode_message,
    validate_attestation,
)

from ..vectors import ROOT as VECTORS
from .jspeer import JS_DIR, JsPeer, require_node, wait_until

pytestmark = pytest.mark.integration
JS_SEED = blake2b256(b"open1b-interop/js-peer")


def ident(n: int) -> Identity:
    return Identity(blake2b256(b"open1b-interop/identity", bytes([n])))


def test_js_decoder_passes_our_vectors(js_ready):
    proc = subprocess.run([require_node(), "check_vectors.mjs", str(VECTORS)], cwd=JS_DIR, capture_output=True,
                          text=True, timeout=120)
    results = json.loads(proc.stdout)
    assert proc.returncode == 0, results
    for suite, result in results.items():
        assert result == {"passed": len(list((VECTORS / suite).glob("*.json"))), "failed": []}, suite


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    from open1b.deterministic.trainer import publish_run

    run_dir = tmp_path_factory.mktemp("interop-run")
    return run_dir, publish_run(run_dir, ident(0), steps=4, seed=11)


def _coverage(api: str, run_hex: str) -> dict:
    from open1b.node.client import call

    return call(api, f"/v1/coverage/{run_hex}")


def test_js_libp2p_peer_among_open1b_daemons(js_ready, small_run, tmp_path):
    from open1b.devnet import Daemons
    from open1b.node.client import call

    run_dir, manifest = small_run
    run_hex = manifest.run_id.hex()
    topic = f"/open1b/2/run/{run_hex}/attestations"
    daemons = Daemons(tmp_path, run_dir, redundancy=1, run_on_all=True)
    observer_addr, auditor_addr = daemons.plan(2)
    auditor_id = auditor_addr.rsplit("/", 1)[1]
    js = JsPeer(JS_SEED, tmp_path / "js-peer.log")
    try:
        js.call("subscribe", topic=topic)
        # the observer trusts the js peer's key too: counting it is what this test checks
        daemons.start(0, audit=False, bootstrap=[], extra_args=("--trust", Identity(JS_SEED).peer_id))
        observer = daemons.api(0)
        js.call("dial", addr=observer_addr)
        wait_until(lambda: observer_addr.rsplit("/", 1)[1] in js.call("topic_peers", topic=topic)["peers"], 30,
                   "the observer's subscription to reach the js peer")

        # the js peer claims step 1 before anyone audits: its record reaches the observer's DHT store
        now = int(time.time())
        claim = js.call("claim", run=run_hex, step=1, slot=0, issued_at=now, lease=900)
        assert Claim.decode(bytes.fromhex(claim["data"])).claimant == Identity(JS_SEED).public_key
        put = js.call("dht_put", key=claim_key(manifest.run_id, 1, 0), value=claim["data"])
        assert observer_addr.rsplit("/", 1)[1] in put["stored"], put

        daemons.start(1, audit=True, bootstrap=[observer_addr, js.addr])
        auditor = daemons.api(1)

        def three_attested() -> bool:
            failures = call(auditor, "/v1/status")["replay_failures"]
            assert failures == 0, f"the auditor's replays failed (not an interop fault); see {daemons.dirs[1]}/daemon.log"
            return _coverage(observer, run_hex)["verified_steps"] == 3

        wait_until(three_attested, 120, "the auditor's three attestations")
        # The auditor reads step 1's DHT record when it turns to that step, which may be after its
        # third attestation reached the observer (its step order is a rendezvous hash of its
        # random peer ID): wait for that, then check it found the js claim and left the step alone.
        wait_until(lambda: _coverage(auditor, run_hex)["per_step"][1]["status"] != "unaudited", 30,
                   "the auditor to consider step 1")
        cov = _coverage(auditor, run_hex)
        assert cov["per_step"][1]["status"] == "claimed" and cov["per_step"][1]["claimants"] == [js.peer_id]
        assert sorted(step for _, step in call(auditor, "/v1/status")["replayed"]) == [0, 2, 3]  # never step 1

        # the js peer got the auditor's attestations on gossip and decoded them as we do
        heard = wait_until(lambda: len({m["decoded"].get("step") for m in js.received(topic)}) >= 3 and js.received(topic),
                           30, "attestations at the js peer")
        ours = {item["encoded"]: Attestation.decode(bytes.fromhex(item["encoded"]))
                for item in call(observer, f"/v1/attestations/{run_hex}")}
        for msg in heard:
            att = ours[msg["data"]]  # the exact bytes the auditor signed
            assert msg["decoded"] == {"kind": "attestation", "signer": att.signer_peer_id, "digest": att.digest.hex(),
                                      "run": run_hex, "step": str(att.step), "verdict": att.verdict,
                                      "pre_state": att.pre_state.hex(), "post_state": att.post_state.hex(),
                                      "issued_at": str(att.issued_at)}
            assert msg["from"] == att.signer_peer_id == auditor_id

        # it reads the auditor's claim on step 0 from the DHT
        record = js.call("dht_get", key=claim_key(manifest.run_id, 0, 0))
        assert record["decoded"]["kind"] == "claim" and record["decoded"]["claimant"] == auditor_id
        assert decode_message(bytes.fromhex(record["value"])).signer_peer_id == auditor_id

        # it attests step 1: two invalid attestations are rejected, the valid one counted
        def signed(forge):
            return js.call("attestation", manifest=manifest.encoded.hex(), step=1, issued_at=int(time.time()), forge=forge)

        forged = {name: signed(name) for name in ("verdict", "signature")}
        for name, expected_code in (("verdict", "verdict"), ("signature", "bad_signature")):
            verdict = validate_attestation(bytes.fromhex(forged[name]["data"]), {manifest.run_id: manifest}.get, int(time.time()))
            assert (verdict.outcome, verdict.code) == (Outcome.REJECT, expected_code)
            js.call("publish", topic=topic, data=forged[name]["data"])
        good = signed(None)
        js.call("publish", topic=topic, data=good["data"])
        final = wait_until(lambda: (c := _coverage(observer, run_hex))["complete"] and c, 60, "coverage with the js attestation")
        assert final["per_step"][1]["auditors"] == [js.peer_id] and final["verified_steps"] == 4
        at_one = [item["digest"] for item in call(observer, f"/v1/attestations/{run_hex}?step=1")]
        assert at_one == [good["decoded"]["digest"]]
        assert call(observer, "/v1/status")["gossip_rejected"] >= 2
    finally:
        js.close()
        daemons.stop()


def test_claim_arbitration_with_a_last_writer_wins_js_dht_server(js_ready, tmp_path):
    """The js server keeps whichever claim was written last; every reader still ends on the claim
    the protocol prefers, because readers select over all answers, their own copy included."""
    import trio

    from open1b.node.claim_records import ClaimRecords
    from open1b.node.p2p import open_p2p
    from open1b.protocol.claims import CLAIM_NAMESPACE

    run = blake2b256(b"some run")
    start = 1_800_000_000 - 1_800_000_000 % 60
    js = JsPeer(JS_SEED, tmp_path / "js-peer.log")

    def conflict(step: int) -> tuple[str, Claim, Claim]:
        better = Claim.create(ident(1), run=run, step=step, slot=0, issued_at=start + 5, lease_expiry=start + 125)
        worse = Claim.create(ident(2), run=run, step=step, slot=0, issued_at=start + 20, lease_expiry=start + 140)
        return claim_key(run, step, 0), better, worse

    async def js_call(cmd, **args):
        return await trio.to_thread.run_sync(lambda: js.call(cmd, **args))

    async def main():
        with trio.fail_after(120):
            async with AsyncExitStack() as stack:
                a = await stack.enter_async_context(open_p2p(ident(3), "127.0.0.1", 0))
                a.register_record_validator(CLAIM_NAMESPACE, ClaimRecords())
                await a.connect(js.addr)
                await trio.sleep(0.5)  # identify tells the js DHT that we serve Kademlia
                for step in (1, 2):
                    key, better, worse = conflict(step)
                    assert await a.put_record(key, better.encoded)  # stored here and at the js peer
                    put = await js_call("dht_put", key=key, value=worse.encoded.hex())
                    assert a.peer_id not in put["stored"]  # our server refused the worse record; the js one kept it
                # step 1: our node reads first. The network's only other answer is the js server's worse
                # record, and our own copy must take part in the choice, or we would adopt the worse one
                key, better, _ = conflict(1)
                assert await a.get_record(key, from_network=True) == better.encoded
                assert (await js_call("dht_get", key=key))["value"] == better.encoded.hex()
                # step 2: the js peer reads first: it selects with our order over its own and our answers
                key, better, _ = conflict(2)
                assert (await js_call("dht_get", key=key))["value"] == better.encoded.hex()
                assert await a.get_record(key, from_network=True) == better.encoded
                # a newcomer reads both keys and agrees
                b = await stack.enter_async_context(open_p2p(ident(4), "127.0.0.1", 0))
                b.register_record_validator(CLAIM_NAMESPACE, ClaimRecords())
                await b.connect(js.addr)
                await b.connect(a.addrs[0])
                await trio.sleep(0.5)
                for step in (1, 2):
                    key, better, _ = conflict(step)
                    assert await b.get_record(key, from_network=True) == better.encoded

    try:
        trio.run(main)
    finally:
        js.close()
