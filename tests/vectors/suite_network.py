"""Suites ``validation``, ``claims`` and ``coverage``: how a node judges what peers send.

``validation`` case: ``{"description", "topic", "runs", "now", "message", "outcome", "reason"}``.
``topic`` is ``attestation``, ``claim``, ``reveal``, ``manifest``, ``sync``, ``eval`` or ``spotcheck``; ``runs`` are the runs the validating node
knows, each ``{"manifest"}`` or ``{"manifest", "trajectory"}`` (an external run); ``outcome`` is
``accept``, ``reject`` or ``ignore`` and ``reason`` the rule's code (``ok`` when accepted).

``claims`` case: ``{"description", "key", "records", "valid", "winner", "order"}``: which records
are valid claims for ``key``, the index of the record every node must prefer (``null`` if none
is valid), and the valid records' indices from most to least preferred. The winner must not
depend on the order the records are presented in.

``coverage`` case: ``{"description", "runs", "attestations", "claims", "reveals", "now", "redundancy",
"policy": {"name", "roots", "quorum"}, "result": {"complete", "steps": [{"step", "status", "auditors",
"dissenters", "claimants", "evidence"}], "flagged": [{"signer", "step", "kind", "statement", "conflicting",
"reveal"}], "untrusted"}}`` (peer IDs sorted; ``roots`` are peer IDs; evidence, statements and conflicting
statements are attestation digests; ``kind`` is ``contradiction`` or ``copier``, and ``reveal`` the
digest of the witness reveal a copier's binding fails, null otherwise; the run is ``runs[0]``).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import cbor2

from open1b.protocol import (
    PROTOCOL_VERSION, Attestation, Claim, Conviction, ProtocolError, signing_bytes, TrustPolicy, blake2b256, claim_key, claim_precedence, coverage, decode_message,
    WitnessReveal, encode, public_key_from_peer_id, resolve_external_run, select_claim_record, sign,
    validate_attestation, validate_claim, validate_claim_record, validate_eval, validate_manifest, validate_reveal,
    validate_spotcheck, validate_sync_frame,
)
from open1b.protocol.validation import MAX_CLOCK_SKEW_SECONDS
from open1b.protocol import MAX_LEASE_SECONDS

from . import ed25519_forgery as forgery
from . import fixtures
from .common import NOW, hx, ident, unhex


FINGERPRINTS = {"fingerprints_root": "7f" * 32, "fingerprints_blob": "0a" * 32}
"""The two data keys that commit to a run's fingerprints (docs/run-format.md §10.1)."""


def forge(signer: int, kind: str, body: dict, *, v=PROTOCOL_VERSION) -> bytes:
    """A correctly signed message whose body the constructors would refuse to build."""
    body = {"kind": kind, "v": v, **body}
    return encode({**body, "sig": sign(ident(signer), kind, body)})


def resign(message, **changes) -> bytes:
    """``message`` with ``changes`` applied, signed again by seed 1 (the vectors' usual signer)."""
    return forge(1, message.KIND, {**_body(message), **changes})


def small_order_signed(kind: str, body: dict, key: bytes = forgery.IDENTITY) -> bytes:
    """A message whose signer field is a small-order key, with a signature that a lax verifier accepts."""
    signer = {"attestation": "signer", "claim": "claimant", "reveal": "revealer"}.get(kind, "publisher")
    body = {"kind": kind, "v": PROTOCOL_VERSION, **body, signer: key}
    return encode({**body, "sig": forgery.sign_as_small_order_key(key, signing_bytes(kind, body))})


def _body(message) -> dict:
    return {k: v for k, v in message.body().items() if k not in ("kind", "v")}


def _runs(case: dict):
    runs = []
    for entry in case["runs"]:
        m = decode_message(unhex(entry["manifest"]))
        runs.append(resolve_external_run(m, unhex(entry["trajectory"])) if "trajectory" in entry else m)
    return runs


class Validation:
    NAME = "validation"

    @staticmethod
    def cases() -> dict[str, dict]:
        m = fixtures.run_manifest()
        traj = fixtures.trajectory_file()
        ext_m = fixtures.external_manifest(traj)
        ext = resolve_external_run(ext_m, traj)
        both = [{"manifest": hx(m.encoded)}, {"manifest": hx(ext_m.encoded), "trajectory": hx(traj)}]
        good = fixtures.attestation(1, m, 1)
        raw = cbor2.loads(good.encoded)
        att = {
            "accept-match": ("a match whose post_state is h_{step+1}", good.encoded),
            "accept-mismatch": ("a mismatch whose post_state differs", fixtures.attestation(1, m, 2, match=False).encoded),
            "accept-external-run": ("an attestation about an external run (log steps 5 -> 6)",
                                    fixtures.attestation(2, ext, 2).encoded),
            "oversize": ("longer than MAX_ATTESTATION_SIZE", encode({**raw, "hardware": "x" * 1100})),
            "malformed": ("truncated CBOR", good.encoded[:-1]),
            "non-canonical": ("the map's keys out of order", cbor2.dumps(dict(sorted(raw.items(), reverse=True)))),
            "kind": ("a claim on the attestations topic", fixtures.claim(1, m, 1).encoded),
            "version": ("protocol version 3, a later one", forge(1, "attestation", _body(good), v=3)),
            "version-missing": ("no v at all: version (step 3), not missing_field (step 5)", encode({
                **(unversioned := {"kind": "attestation", **_body(good)}),
                "sig": sign(ident(1), "attestation", unversioned)})),
            "unknown-field": ("an extra field", forge(1, "attestation", {**_body(good), "note": "hi"})),
            "missing-field": ("no hardware field", forge(1, "attestation", {k: v for k, v in _body(good).items() if k != "hardware"})),
            "wrong-type": ("step as text", forge(1, "attestation", {**_body(good), "step": "1"})),
            "bad-signature": ("a field changed after signing", encode({**raw, "elapsed_ms": 1})),
            "wrong-signer": ("signed by a key other than the signer field's",
                             forge(2, "attestation", _body(good))),
            "unknown-run": ("a run this node does not know", fixtures.attestation(1, fixtures.run_manifest(publisher=3), 1).encoded),
            "future": ("issued beyond the clock-skew allowance",
                       fixtures.attestation(1, m, 1, issued_at=NOW + MAX_CLOCK_SKEW_SECONDS + 1).encoded),
            "future-within-skew": ("issued exactly at the clock-skew allowance",
                                   fixtures.attestation(1, m, 1, issued_at=NOW + MAX_CLOCK_SKEW_SECONDS).encoded),
            "step-range": ("step == steps", forge(1, "attestation", {**_body(good), "step": m.steps})),
            "pre-state": ("pre_state is not h_step", fixtures.attestation(1, m, 1, pre_state=m.state_hashes[0]).encoded),
            "verdict": ("says match but post_state differs",
                        fixtures.attestation(1, m, 1, post_state=m.state_hashes[0]).encoded),
            "engine": ("another engine version", fixtures.attestation(1, m, 1, engine_version="2").encoded),
            "external-pre-state": ("an external run's attestation starting from the wrong log step",
                                   fixtures.attestation(2, ext, 2, pre_state=ext.state_hashes[1]).encoded),
            "accept-cuda": ("a replay on a CUDA device class", fixtures.attestation(1, m, 1, device="cuda/sm_90").encoded),
            "accept-device-no-target": ("a device class without a target part",
                                        fixtures.attestation(1, m, 1, device="cpu/riscv64").encoded),
            "device": ("a device class outside the grammar (backend gpu)", resign(good, device="gpu/h100")),
            "device-backend-only": ("a backend alone (cpu), with no part after it", resign(good, device="cpu")),
            "device-upper-case": ("a device class with an upper-case letter", resign(good, device="cpu/X86_64-avx2")),
            "device-two-targets": ("a device class with two target parts", resign(good, device="cpu/x86_64-avx2-fma")),
            "device-long-part": ("a device class part of 33 characters", resign(good, device="cuda/" + "s" * 33)),
            "device-empty-target": ("a device class whose target is empty", resign(good, device="cpu/x86_64-")),
            "device-newline": ("a device class followed by a newline", resign(good, device="cpu/x86_64\n")),
            "device-wrong-type": ("a device that is not text: wrong_type, not device", resign(good, device=7)),
            "device-before-signature": ("a bad device class and a bad signature: the cross-field rule comes first",
                                        encode({**cbor2.loads(resign(good, device="gpu/h100")), "elapsed_ms": 2})),
            "version-1": ("a message of protocol version 1", forge(1, "attestation", _body(good), v=1)),
            "version-bool": ("v is true, not an integer", forge(1, "attestation", _body(good), v=True)),
            "version-float": ("v is 2.0, a float", forge(1, "attestation", _body(good), v=2.0)),
            "kind-before-version": ("a claim of protocol version 1 on the attestation topic: kind is checked first",
                                    forge(1, "claim", _body(fixtures.claim(1, m, 1)), v=1)),
            "step-bool": ("step is true, not an integer", resign(good, step=True)),
            "elapsed-negative": ("elapsed_ms is -1", resign(good, elapsed_ms=-1)),
            "unknown-before-missing": ("an extra field and a missing one: unknown_field first",
                                       forge(1, "attestation", {**{k: v for k, v in _body(good).items() if k != "hardware"},
                                                                "note": "hi"})),
            "missing-before-wrong-type": ("a missing field and a mistyped one: missing_field first",
                                          forge(1, "attestation", {**{k: v for k, v in _body(good).items()
                                                                      if k != "hardware"}, "step": "1"})),
            "non-text-key": ("a map key that is an integer: not canonical CBOR of a message (malformed)",
                             encode({**raw, "x": 1}).replace(b"\x61x", b"\x17", 1)),
            "oversize-garbage": ("more than MAX_ATTESTATION_SIZE bytes of garbage: oversize before malformed",
                                 b"\xff" * 1025),
            "signer-small-order": ("signed by a small-order key with a signature the plain equation accepts",
                                   small_order_signed("attestation", {k: v for k, v in _body(good).items()
                                                                      if k != "signer"})),
            "signature-s-plus-l": ("a good signature with L added to S", encode({**raw, "sig": forgery.s_plus_l(raw["sig"])})),
            "signature-before-unknown-run": ("a bad signature on an attestation of an unknown run",
                                             encode({**cbor2.loads(fixtures.attestation(1, fixtures.run_manifest(publisher=3), 1).encoded),
                                                     "elapsed_ms": 2})),
            "unknown-run-before-future": ("an unknown run, issued in the future: unknown_run first",
                                          fixtures.attestation(1, fixtures.run_manifest(publisher=3), 1,
                                                               issued_at=NOW + 600).encoded),
            "future-before-step-range": ("issued in the future and past the run's steps: future first",
                                         resign(good, step=m.steps, issued_at=NOW + 600)),
            "pre-state-before-verdict": ("a wrong pre_state and a verdict its post_state contradicts: pre_state first",
                                         fixtures.attestation(1, m, 1, pre_state=m.state_hashes[0],
                                                              post_state=m.state_hashes[0]).encoded),
            "verdict-before-engine": ("a wrong verdict and another engine: verdict first",
                                      fixtures.attestation(1, m, 1, post_state=m.state_hashes[0],
                                                           engine_version="2").encoded),
            "mismatch-claiming-published": ("a mismatch whose post_state is h_{step+1}",
                                            fixtures.attestation(1, m, 1, verdict="mismatch").encoded),
            "last-step": ("the last step of the run (step == steps - 1)", fixtures.attestation(1, m, m.steps - 1).encoded),
            "engine-name": ("another engine name, same version", fixtures.attestation(1, m, 1, engine="other").encoded),
        }
        c = fixtures.claim(1, m, 1)
        claims = {
            "claim-accept": ("a live claim", c.encoded),
            "claim-lease-order": ("lease_expiry equal to issued_at", forge(1, "claim", {**_body(c), "lease_expiry": c.issued_at})),
            "claim-lease-length": ("a lease longer than MAX_LEASE_SECONDS", fixtures.claim(1, m, 1, lease=3601).encoded),
            "claim-step-range": ("a claim on a step the run does not have", fixtures.claim(1, m, 4).encoded),
            "claim-unknown-run": ("a claim on an unknown run", fixtures.claim(1, fixtures.run_manifest(publisher=3), 0).encoded),
            "claim-future": ("a claim issued in the future", fixtures.claim(1, m, 1, issued_at=NOW + 600).encoded),
            "claim-lease-max": ("a lease of exactly MAX_LEASE_SECONDS", fixtures.claim(1, m, 1, lease=3600).encoded),
            "claim-lease-order-before-signature": ("lease_expiry before issued_at and a bad signature",
                                                   encode({**cbor2.loads(forge(1, "claim", {**_body(c), "lease_expiry": 1})),
                                                           "slot": 1})),
            "claim-slot-range": ("slot 256", forge(1, "claim", {**_body(c), "slot": 256})),
            "claim-expected-done": ("a claim with the optional expected_done (r13)",
                                    fixtures.claim(1, m, 1, expected_done=NOW + 5400).encoded),
            "claim-expected-done-null": ("expected_done null: an absent value is an absent key",
                                         forge(1, "claim", {**_body(c), "expected_done": None})),
            "claim-expected-done-wrong-type": ("expected_done a text", forge(1, "claim", {**_body(c), "expected_done": "soon"})),
            "claim-device": ("a claim naming the device class its claimant replays on (r21)",
                             fixtures.claim(1, m, 1, device="cuda/sm_90", expected_done=NOW + 5400).encoded),
            "claim-device-not-a-class": ("a claim's device outside the grammar",
                                         forge(1, "claim", {**_body(c), "device": "CUDA/sm_90"})),
            "claim-device-null": ("device null: an absent value is an absent key",
                                  forge(1, "claim", {**_body(c), "device": None})),
            "claim-lease-order-before-device": ("lease_expiry equal to issued_at and a device outside the grammar: "
                                                "lease_order first",
                                                forge(1, "claim", {**_body(c), "lease_expiry": c.issued_at,
                                                                   "device": "gpu/h100"})),
            "claim-small-order": ("a claim signed by a small-order key",
                                  small_order_signed("claim", {k: v for k, v in _body(c).items() if k != "claimant"})),
            "claim-future-before-lease-length": ("issued in the future with too long a lease: future first",
                                                 fixtures.claim(1, m, 1, issued_at=NOW + 600, lease=4000).encoded),
        }
        rv = fixtures.reveal(1, m, 1)
        reveals = {
            "reveal-accept": ("a reveal whose witness opens the run's commitment C_1", rv.encoded),
            "reveal-witness": ("a reveal of step 1 whose witness does not open C_1",
                               fixtures.reveal(1, m, 1, witness=rv.witness[::-1]).encoded),
            "reveal-step-range": ("a reveal of a step the run does not have", forge(1, "reveal", {**_body(rv), "step": 4})),
            "reveal-unknown-run": ("a reveal about an unknown run",
                                   fixtures.reveal(1, fixtures.run_manifest(publisher=3), 1).encoded),
            "reveal-external-run": ("a reveal about an external run, which commits to no witness",
                                    fixtures.reveal(1, ext, 1).encoded),
            "reveal-future": ("a reveal issued in the future", fixtures.reveal(1, m, 1, issued_at=NOW + 600).encoded),
            "reveal-kind": ("an attestation on the reveal topic", good.encoded),
        }
        manifests = {
            "manifest-accept": ("a run manifest", m.encoded),
            "manifest-external-accept": ("an external manifest", ext_m.encoded),
            "manifest-state-hashes": ("steps + 1 != len(state_hashes)",
                                      forge(0, "manifest", {**_body(m), "steps": m.steps + 1})),
            "manifest-future": ("created in the future", forge(0, "manifest", {**_body(m), "created_at": NOW + 3600})),
            "manifest-kind": ("an attestation on the manifest topic", good.encoded),
            "manifest-run-format": ("run format 1", forge(0, "manifest", {**_body(m), "format": 1})),
            "manifest-run-format-before-schema": ("run format 1 with an unknown field: run_format first",
                                                  forge(0, "manifest", {**_body(m), "format": 1, "note": "x"})),
            "manifest-run-format-text": ("run format as text", forge(0, "manifest", {**_body(m), "format": "2"})),
            "manifest-version-before-run-format": ("protocol version 1 and run format 1: version first",
                                                   forge(0, "manifest", {**_body(m), "format": 1}, v=1)),
            "manifest-steps-zero": ("steps 0 with one state hash",
                                    forge(0, "manifest", {**_body(m), "steps": 0, "state_hashes": m.state_hashes[:1],
                                                          "checkpoints": m.checkpoints[:1], "witnesses": []})),
            "manifest-checkpoints": ("steps + 2 checkpoints",
                                     forge(0, "manifest", {**_body(m), "checkpoints": m.checkpoints + [bytes(32)]})),
            "manifest-witnesses": ("steps - 1 witness commitments",
                                   forge(0, "manifest", {**_body(m), "witnesses": m.witnesses[:-1]})),
            "manifest-samples": ("no samples", forge(0, "manifest", {**_body(m), "samples": 0})),
            "manifest-fingerprints-accept": ("a run that commits to fingerprints (docs/run-format.md §10.1)",
                                             forge(0, "manifest", {**_body(m), "data": {**m.data, **FINGERPRINTS}})),
            "manifest-fingerprints-alone": ("fingerprints_root without fingerprints_blob",
                                            forge(0, "manifest", {**_body(m), "data": {
                                                **m.data, "fingerprints_root": FINGERPRINTS["fingerprints_root"]}})),
            "manifest-fingerprints-upper": ("a fingerprints_root in uppercase hex",
                                            forge(0, "manifest", {**_body(m), "data": {
                                                **m.data, **FINGERPRINTS,
                                                "fingerprints_root": FINGERPRINTS["fingerprints_root"].upper()}})),
            "manifest-fingerprints-int": ("a fingerprints_blob that is an integer, not hex text",
                                          forge(0, "manifest", {**_body(m), "data": {
                                              **m.data, **FINGERPRINTS, "fingerprints_blob": 7}})),
            "manifest-fingerprints-short": ("a fingerprints_blob of 63 hex digits",
                                            forge(0, "manifest", {**_body(m), "data": {
                                                **m.data, **FINGERPRINTS, "fingerprints_blob": "a" * 63}})),
            "manifest-samples-before-fingerprints": ("no samples and a malformed fingerprints_root: samples first",
                                                     forge(0, "manifest", {**_body(m), "samples": 0, "data": {
                                                         **m.data, "fingerprints_root": "x"}})),
            "manifest-state-hashes-before-checkpoints": ("state hashes and checkpoints both one short: state_hashes first",
                                                        forge(0, "manifest", {**_body(m), "state_hashes": m.state_hashes[:-1],
                                                                              "checkpoints": m.checkpoints[:-1]})),
            "manifest-checkpoints-before-witnesses": ("checkpoints and witnesses both wrong: checkpoints first",
                                                     forge(0, "manifest", {**_body(m), "checkpoints": m.checkpoints[:-1],
                                                                           "witnesses": m.witnesses[:-1]})),
            "manifest-witnesses-before-samples": ("witnesses wrong and no samples: witnesses first",
                                                 forge(0, "manifest", {**_body(m), "witnesses": [], "samples": 0})),
            "manifest-cross-field-before-signature": ("no samples and a bad signature: the cross-field rule first",
                                                      encode({**cbor2.loads(forge(0, "manifest", {**_body(m), "samples": 0})),
                                                              "seed": 8})),
            "manifest-model-bool": ("a model value that is a bool", forge(0, "manifest", {**_body(m), "model": {"x": True}})),
            "manifest-model-nan": ("a model value that is NaN", forge(0, "manifest", {**_body(m), "model": {"x": float("nan")}})),
            "manifest-model-infinity": ("a model value that is infinite",
                                        forge(0, "manifest", {**_body(m), "model": {"x": float("-inf")}})),
            "manifest-model-null": ("a model value that is null", forge(0, "manifest", {**_body(m), "model": {"x": None}})),
            "manifest-model-nested": ("a model value that is a list", forge(0, "manifest", {**_body(m), "model": {"x": [1]}})),
            "manifest-model-key-long": ("a model key of 257 bytes",
                                        forge(0, "manifest", {**_body(m), "model": {"k" * 257: 1}})),
            "manifest-model-scalars": ("model values at their bounds: -2^64, a float, 256 bytes of text",
                                       forge(0, "manifest", {**_body(m), "model": {"a": -(2**64), "b": -0.5, "c": "é" * 128}})),
            "manifest-data-entries": ("17 data entries (at most 16)",
                                      forge(0, "manifest", {**_body(m), "data": {f"k{i}": i for i in range(17)}})),
            "manifest-small-order": ("a manifest signed by a small-order key",
                                     small_order_signed("manifest", {k: v for k, v in _body(m).items() if k != "publisher"})),
            "manifest-future-within-skew": ("created exactly at the clock-skew allowance",
                                            forge(0, "manifest", {**_body(m), "created_at": NOW + MAX_CLOCK_SKEW_SECONDS})),
            "manifest-external-steps-zero": ("an external manifest with steps 0",
                                             forge(0, "external_manifest", {**_body(ext_m), "steps": 0})),
            "manifest-external-format": ("an external manifest whose trajectory format is not jsonl",
                                         forge(0, "external_manifest", {**_body(ext_m), "trajectory_format": "csv"})),
            "manifest-external-future": ("an external manifest created in the future",
                                         forge(0, "external_manifest", {**_body(ext_m), "created_at": NOW + 600})),
        }
        sm = fixtures.spot_manifest()
        sc = fixtures.spotcheck(1, sm, 2)
        frames = {  # a sync frame holds an attestation, a reveal or a spot check (§11.1): the largest limit, then the kind's
            "sync-attestation": ("an attestation in a sync frame", good.encoded),
            "sync-reveal": ("a reveal in a sync frame", rv.encoded),
            "sync-reveal-oversize": ("a 600-byte reveal: within the attestation limit, over the reveal limit",
                                     forge(1, "reveal", {**_body(rv), "note": "x" * 300})),
            "sync-oversize": ("a frame over the larger limit", encode({**raw, "hardware": "x" * 1100})),
            "sync-kind": ("a claim in a sync frame", c.encoded),
            "sync-reveal-witness": ("a reveal in a sync frame whose witness does not open C_1",
                                    fixtures.reveal(1, m, 1, witness=rv.witness[::-1]).encoded),
            "sync-spotcheck": ("a spot check in a sync frame", sc.encoded),
            "sync-spotcheck-derivation": ("a spot check in a sync frame whose slot the challenge does not select",
                                          fixtures.spotcheck(1, sm, 2, slot=(sc.slot + 1) % 4).encoded),
        }
        em = fixtures.eval_manifest()
        ev = fixtures.evaluation(1, em, 2)
        raw_ev = _body(ev)
        evals = {
            "eval-accept-result": ("the publisher's result for state 2", fixtures.evaluation(
                0, em, 2, verdict="result").encoded),
            "eval-accept-match": ("a match of the result, state 2", ev.encoded),
            "eval-accept-mismatch": ("a mismatch: the signer computed another loss", fixtures.evaluation(
                2, em, 4, verdict="mismatch", loss=fixtures.LOSS + 1).encoded),
            "eval-kind": ("an attestation on the eval topic", good.encoded),
            "eval-verdict": ("a match whose loss is not the claimed one", forge(
                1, "eval", {**raw_ev, "loss": fixtures.LOSS + 1})),
            "eval-verdict-mismatch": ("a mismatch whose loss is the claimed one", forge(
                1, "eval", {**raw_ev, "verdict": "mismatch"})),
            "eval-verdict-result": ("the publisher's result whose loss is not the claimed one", forge(
                0, "eval", {**_body(fixtures.evaluation(0, em, 2, verdict="result")), "loss": fixtures.LOSS + 1})),
            "eval-verdict-before-device": ("a result with loss != claimed and a bad device: the verdict rule first",
                                           forge(0, "eval", {**_body(fixtures.evaluation(0, em, 2, verdict="result")),
                                                             "loss": 1, "device": "tpu"})),
            "eval-device": ("a device that is not a device class", forge(1, "eval", {**raw_ev, "device": "gpu"})),
            "eval-unknown-run": ("an eval of a run nobody published", fixtures.evaluation(
                1, fixtures.eval_manifest(steps=6), 2).encoded),
            "eval-future": ("dated beyond the clock skew", fixtures.evaluation(
                1, em, 2, issued_at=NOW + MAX_CLOCK_SKEW_SECONDS + 1).encoded),
            "eval-future-before-state": ("dated in the future and off the schedule: unjudgeable first",
                                         fixtures.evaluation(1, em, 3, issued_at=NOW + 10_000).encoded),
            "eval-no-eval": ("an eval of a run without an evaluation schedule", fixtures.evaluation(1, m, 2).encoded),
            "eval-state-off-schedule": ("state 3, the schedule is every 2", fixtures.evaluation(1, em, 3).encoded),
            "eval-state-zero": ("state 0 is not evaluated", fixtures.evaluation(1, em, 0).encoded),
            "eval-state-beyond": ("state 6 of a 4-step run", fixtures.evaluation(1, em, 6).encoded),
            "eval-engine": ("another engine version", fixtures.evaluation(1, em, 2, engine_version="2").encoded),
            "eval-signer-result": ("a result signed by a key that is not the publisher's", fixtures.evaluation(
                1, em, 2, verdict="result").encoded),
            "eval-signer-check": ("a match signed by the publisher itself", fixtures.evaluation(0, em, 2).encoded),
            "eval-state-before-signer": ("off the schedule and a result by another key: the schedule first",
                                         fixtures.evaluation(1, em, 1, verdict="result").encoded),
        }
        spots = {
            "spotcheck-accept-pass": ("a passing spot check of step 2", sc.encoded),
            "spotcheck-accept-fail": ("a spot check of step 1 that caught a broken update link",
                                      fixtures.spotcheck(2, sm, 1, caught="update").encoded),
            "spotcheck-verdict": ("a pass that names a broken link", forge(1, "spotcheck", {
                **_body(sc), "caught": "update"})),
            "spotcheck-step-range": ("step 4 of a 4-step run", forge(1, "spotcheck", {**_body(sc), "step": 4})),
            "spotcheck-pre-state": ("recomputed from another state", fixtures.spotcheck(
                1, sm, 2, pre_state=fixtures.state(3)).encoded),
            "spotcheck-engine": ("another engine version", fixtures.spotcheck(1, sm, 2, engine_version="2").encoded),
            "spotcheck-pre-state-before-engine": ("another state and another engine: pre_state first",
                                                  fixtures.spotcheck(1, sm, 2, pre_state=fixtures.state(3),
                                                                     engine_version="2").encoded),
            "spotcheck-challenge": ("another key's challenge", fixtures.spotcheck(
                1, sm, 2, challenge=fixtures.spotcheck(2, sm, 2).challenge).encoded),
            "spotcheck-slot-challenge": ("the chunks' signature given as the slot's (the slot must stay secret "
                                         "while the trainer holds the chunks' challenge)", fixtures.spotcheck(
                1, sm, 2, slot_challenge=sc.challenge, slot=fixtures.derive_slot(sc.challenge, 4)).encoded),
            "spotcheck-derivation": ("a slot the slot challenge does not select", fixtures.spotcheck(
                1, sm, 2, slot=(sc.slot + 1) % 4).encoded),
            "spotcheck-no-topology": ("a spot check of a run whose model map names no topology",
                                      fixtures.spotcheck(1, m, 2).encoded),
        }
        with_eval = [{"manifest": hx(m.encoded)}, {"manifest": hx(em.encoded)}]
        with_spot = [{"manifest": hx(m.encoded)}, {"manifest": hx(sm.encoded)}]
        out = {}
        for topic, group in (("attestation", att), ("claim", claims), ("reveal", reveals), ("manifest", manifests),
                             ("sync", frames), ("eval", evals), ("spotcheck", spots)):
            for name, (description, message) in group.items():
                runs = ([] if topic == "manifest" else with_eval if topic == "eval"
                        else with_spot if topic == "spotcheck" or name.startswith("sync-spotcheck") else both)  # fmt: skip
                case = {"description": description, "topic": topic, "runs": runs,
                        "now": NOW, "message": hx(message)}
                verdict = Validation._judge(case)
                out[name] = {**case, "outcome": verdict.outcome.value, "reason": verdict.code}
        return out

    @staticmethod
    def _judge(case: dict):
        runs = {r.run_id: r for r in _runs(case)}
        data = unhex(case["message"])
        if case["topic"] == "attestation":
            return validate_attestation(data, runs.get, case["now"])
        if case["topic"] == "claim":
            return validate_claim(data, runs.get, case["now"])
        if case["topic"] == "reveal":
            return validate_reveal(data, runs.get, case["now"])
        if case["topic"] == "sync":
            return validate_sync_frame(data, runs.get, case["now"])
        if case["topic"] == "eval":
            return validate_eval(data, runs.get, case["now"])
        if case["topic"] == "spotcheck":
            return validate_spotcheck(data, runs.get, case["now"])
        return validate_manifest(data, case["now"])

    @staticmethod
    def check(case: dict, root: Path) -> None:
        verdict = Validation._judge(case)
        assert (verdict.outcome.value, verdict.code) == (case["outcome"], case["reason"]), verdict.reason


class Claims:
    NAME = "claims"

    @staticmethod
    def cases() -> dict[str, dict]:
        m = fixtures.run_manifest()
        key = claim_key(m.run_id, 1, 0)
        start = NOW - NOW % 60  # the start of a lease round
        def c(who: int, at: int, **kw) -> bytes:
            return fixtures.claim(who, m, 1, issued_at=at, **kw).encoded
        tampered = cbor2.loads(c(1, start - 300))
        tampered["lease_expiry"] += 1
        sets = {
            "newer-round-wins": ("a claim of a later lease round beats an earlier one, however early",
                                 [c(1, start - 60), c(2, start + 59)]),
            "earliest-in-round": ("within a round the earliest claim wins", [c(1, start + 10), c(2, start + 5)]),
            "lowest-claimant-on-tie": ("same issue time: the lowest claimant key wins",
                                       [c(1, start + 1), c(2, start + 1), c(3, start + 1)]),
            "same-claimant-lowest-bytes": ("one claimant, two leases issued at once: the lower bytes win",
                                           [c(1, start + 1, lease=300), c(1, start + 1, lease=120)]),
            "invalid-never-wins": ("a tampered record and garbage never win, whatever their time",
                                   [encode(tampered), b"\xa0", c(2, start + 30)]),
            "wrong-key": ("a claim on another step stored under this key is invalid",
                          [fixtures.claim(1, m, 2, issued_at=start).encoded, c(2, start + 20)]),
            "none-valid": ("no valid record: nothing wins", [b"", encode(tampered)]),
            "long-lease-record": ("a record whose lease exceeds MAX_LEASE_SECONDS is a valid record (lease_length is "
                                  "a run rule of the claims topic, not of records): it wins its round",
                                  [c(1, start + 10, lease=MAX_LEASE_SECONDS + 1), c(2, start + 20)]),
        }
        out = {}
        for name, (description, records) in sets.items():
            valid = [Claims._valid(key, r) for r in records]
            order = sorted((i for i, ok in enumerate(valid) if ok),
                           key=lambda i: claim_precedence(Claim.decode(records[i])))
            out[name] = {"description": description, "key": key, "records": [hx(r) for r in records],
                         "valid": valid, "winner": select_claim_record(key, records), "order": order}
        return out

    @staticmethod
    def _valid(key: str, record: bytes) -> bool:
        try:
            validate_claim_record(key, record)
        except ProtocolError:
            return False
        return True

    @staticmethod
    def check(case: dict, root: Path) -> None:
        records = [unhex(r) for r in case["records"]]
        assert [Claims._valid(case["key"], r) for r in records] == case["valid"]
        order = sorted((i for i, ok in enumerate(case["valid"]) if ok),
                       key=lambda i: claim_precedence(Claim.decode(records[i])))
        assert order == case["order"]
        winner = case["winner"]
        assert select_claim_record(case["key"], records) == winner
        assert winner == (order[0] if order else None)
        for perm in itertools.permutations(range(len(records))):  # the order records arrive in does not matter
            picked = select_claim_record(case["key"], [records[i] for i in perm])
            assert (picked is None) == (winner is None)
            assert picked is None or records[perm[picked]] == records[winner]


def _bytes(statement) -> bytes:
    return statement if type(statement) is bytes else statement.encoded


def _decoded(cls, encoded: list[str]) -> list:
    """The statements that decode (§5.2); coverage counts nothing else (§8.3 step 1)."""
    out = []
    for data in encoded:
        try:
            out.append(cls.decode(unhex(data)))
        except ProtocolError:
            continue
    return out


class CoverageSuite:
    NAME = "coverage"

    @staticmethod
    def cases() -> dict[str, dict]:
        m = fixtures.run_manifest()
        traj = fixtures.trajectory_file()
        ext_m = fixtures.external_manifest(traj)
        ext = resolve_external_run(ext_m, traj)
        A = fixtures.attestation
        out = {}
        sets = {
            "four-statuses": ("verified, disputed, claimed, unaudited", [{"manifest": hx(m.encoded)}],
                              [A(1, m, 0), A(2, m, 0), A(1, m, 1), A(2, m, 1, match=False)],
                              [fixtures.claim(3, m, 2, issued_at=NOW - 10)], 2),
            "distinct-keys": ("one key attesting a step three times counts once",
                              [{"manifest": hx(m.encoded)}], [A(1, m, 0, issued_at=NOW - i) for i in range(3)], [], 2),
            "inconsistent-not-counted": ("attestations inconsistent with the run, or of another run, do not count",
                                         [{"manifest": hx(m.encoded)}],
                                         [A(1, m, 0, pre_state=m.state_hashes[1]), A(2, fixtures.run_manifest(publisher=3), 0)],
                                         [], 1),
            "expired-claim": ("a claim whose lease has run out does not count",
                              [{"manifest": hx(m.encoded)}], [], [fixtures.claim(3, m, 0, issued_at=NOW - 200, lease=100)], 1),
            "complete": ("every step has two distinct attesters (either verdict): complete at redundancy 2",
                         [{"manifest": hx(m.encoded)}],
                         [A(s, m, k, match=not (k == 3 and s == 2)) for k in range(4) for s in (1, 2)], [], 2),
            "external-run": ("coverage of an external run's 6 steps",
                             [{"manifest": hx(ext_m.encoded), "trajectory": hx(traj)}],
                             [A(1, ext, 0), A(2, ext, 0), A(1, ext, 5, match=False)], [fixtures.claim(2, ext, 3)], 2),
        }
        odd = blake2b256(b"vector-another-wrong")
        one = [{"manifest": hx(m.encoded)}]
        settle = {"name": "open", "roots": [], "quorum": 2}
        # a voucher whose match on step 0 has the lowest digest among the keys backing that result
        vouch = next(n for n in range(10, 300) if A(n, m, 0).digest < min(A(2, m, 0).digest, A(3, m, 0).digest))
        policies = {
            "refuted": ("quorum 2: two agreeing mismatches refute step 0; the key that matched it is flagged"
                        " and its match on step 1 stops counting", one,
                        [A(1, m, 0), A(2, m, 0, match=False), A(3, m, 0, match=False), A(1, m, 1), A(2, m, 1)], [], 2,
                        settle),
            "lone-dissent-flagged": ("quorum 2: two matches settle step 2; the lone mismatch is flagged", one,
                                     [A(1, m, 2), A(2, m, 2), A(3, m, 2, match=False)], [], 1, settle),
            "no-majority": ("quorum 2: dissenters disagree with each other and with the match: nothing settles",
                            one, [A(1, m, 0), A(2, m, 0, match=False), A(3, m, 0, match=False, post_state=odd)], [], 1,
                            settle),
            "self-contradiction": ("quorum 2: a key reporting two results for one step is flagged", one,
                                   [A(4, m, 1), A(4, m, 1, match=False)], [], 1, settle),
            "evidence-from-unflagged": ("quorum 2: a key vouching for every published hash and a key disputing every"
                                        " step are both flagged; the evidence against the disputer cites an honest"
                                        " match, not the other flagged key's", one,
                                        [A(vouch, m, 0), A(vouch, m, 1), A(9, m, 0, match=False),
                                         A(9, m, 1, match=False, post_state=odd), A(2, m, 0), A(3, m, 0),
                                         A(4, m, 1, match=False), A(5, m, 1, match=False)], [], 1, settle),
            "allowlist": ("allowlist: only the roots count; four other keys attesting every step are listed as untrusted",
                          one, [A(1, m, 0), A(2, m, 1)] + [A(s, m, k) for s in range(5, 9) for k in range(4)], [], 1,
                          {"name": "allowlist", "roots": sorted([ident(1).peer_id, ident(2).peer_id]), "quorum": 2}),
        }
        default = {"name": "open", "roots": [], "quorum": 0}
        R, copy = fixtures.reveal, fixtures.copied
        proofs = {  # name -> (description, attestations, reveals, redundancy, policy)
            "copier": ("key 5 re-signs key 1's match of step 1, witness binding included; a reveal of W_1 shows the"
                       " binding is key 1's, not key 5's: key 5 is flagged a copier and its own match of step 2"
                       " stops counting too", [A(1, m, 1), copy(5, A(1, m, 1)), A(5, m, 2), A(2, m, 2)],
                       [R(1, m, 1)], 1, default),
            "copier-unrevealed": ("the same copy without a reveal: nothing shows it, and it counts",
                                  [A(1, m, 1), copy(5, A(1, m, 1))], [], 2, default),
            "reveal-invalid": ("a reveal that does not open C_1 is not counted: nobody is flagged",
                               [A(1, m, 1), copy(5, A(1, m, 1))], [R(2, m, 1, witness=fixtures.state(9))], 1, default),
            "reveal-needs-a-replay": ("a valid reveal flags a match only when another key's match binds the witness:"
                                      " key 3's binding of step 0 is wrong and nobody's is right, so nobody is"
                                      " flagged, but that match is unproven and does not count; its match of"
                                      " step 1 does", [A(3, m, 0, witness=fixtures.state(8)), A(3, m, 1)],
                                      [R(1, m, 0)], 1, default),
            "mismatch-not-judged": ("a mismatch's witness binding is not judged: its replay may legitimately compute"
                                    " another witness (a forged batch)", [A(1, m, 3), A(2, m, 3, match=False,
                                    witness=fixtures.state(7))], [R(1, m, 3)], 1, default),
            "copiers-do-not-settle": ("quorum 2: two copiers of a match cannot outvote two agreeing mismatches; they"
                                      " are flagged copiers and step 0 stays disputed",
                                      [A(1, m, 0), A(4, m, 0), A(2, m, 0, match=False), A(3, m, 0, match=False),
                                       copy(5, A(1, m, 0)), copy(6, A(1, m, 0))], [R(4, m, 0), R(1, m, 0)], 1, settle),
        }
        def roots(*keys: int) -> dict:
            return {"name": "allowlist", "roots": sorted(ident(k).peer_id for k in keys), "quorum": 2}
        C = fixtures.claim
        other = fixtures.run_manifest(publisher=3)
        unbound = fixtures.state(8)  # a witness binding that binds nothing
        torn = encode({**cbor2.loads(A(1, m, 0).encoded), "elapsed_ms": 1})  # its signature no longer verifies
        def middle_lowest(statements: list) -> list:  # the lowest digest neither first nor last
            low, mid, high = sorted(statements, key=lambda x: x.digest)
            return [mid, low, high]
        # a prover whose match of step 1 has a lower digest than key 1's
        prover = next(n for n in range(10, 300) if A(n, m, 1).digest < A(1, m, 1).digest)
        rules = {  # name -> (description, attestations, claims, reveals, redundancy, policy)
            "claims-count-whoever-signs": (
                "claims are hints: a live claim by a key the policy does not count (7), or by a flagged key (4),"
                " makes a step claimed", [A(4, m, 0), A(4, m, 0, match=False)], [C(4, m, 0), C(7, m, 1)], [], 1,
                roots(1, 4)),
            "unproven-match-mismatch-counts": (
                "a key's unproven match of a revealed step does not count, but its mismatch of that step does",
                [A(3, m, 0, witness=unbound), A(3, m, 0, match=False)], [], [R(1, m, 0)], 1, default),
            "proven-and-unbound-flagged": (
                "a key with a proven and an unbound match of step 1 is a copier when another key proved the step:"
                " after a reveal anyone can bind W_1, so a later proven match does not excuse the copy",
                [A(1, m, 1), A(5, m, 1), A(5, m, 1, witness=unbound, issued_at=NOW - 1)], [], [R(1, m, 1)], 1, default),
            "proven-and-unbound-alone": (
                "a key with a proven and an unbound match of step 1 and no other prover is not flagged; it audited",
                [A(5, m, 1), A(5, m, 1, witness=unbound, issued_at=NOW - 1)], [], [R(1, m, 1)], 1, default),
            "quorum-0-self-contradiction": (
                "quorum 0 flags no contradiction, not even a key's two results for one step",
                [A(4, m, 1), A(4, m, 1, match=False)], [], [], 1, default),
            "settled-again-after-flags": (
                "quorum 2: step 1 settles on a mismatch, which flags key 2; without key 2, step 0 settles on"
                " the mismatch that tied before and is refuted; key 1, which matched step 0, is not flagged (one pass)",
                [A(1, m, 0), A(2, m, 0), A(3, m, 0, match=False), A(4, m, 0, match=False),
                 A(1, m, 1, match=False), A(5, m, 1, match=False), A(2, m, 1)], [], [], 1, settle),
            "evidence-lowest-per-result": (
                "a key's two mismatches of one result are one piece of evidence (the lower digest); its other"
                " result is another", [A(9, m, 1, match=False), A(9, m, 1, match=False, issued_at=NOW - 1),
                                       A(9, m, 1, match=False, post_state=odd)], [], [], 1, default),
            "devices": (
                "devices of the counted matches: two keys on three devices; not a mismatch's, an untrusted key's"
                " (6) or a flagged key's (4)",
                [A(1, m, 0), A(2, m, 0, device="cuda/sm_90"), A(2, m, 0, device="cuda/sm_80", issued_at=NOW - 1),
                 A(3, m, 0, match=False, device="cpu/aarch64-neon"), A(6, m, 0, device="cpu/x86_64-avx512"),
                 A(4, m, 0, device="cuda/sm_75"), A(4, m, 1), A(4, m, 1, match=False)], [], [], 1, roots(1, 2, 3, 4)),
            "devices-unbound-not-listed": (
                "an unbound match's device is not listed, though its key's proven match counts",
                [A(3, m, 2, device="cuda/sm_89"), A(3, m, 2, device="cuda/sm_86", witness=unbound)], [], [R(1, m, 2)],
                1, default),
            "statements-that-do-not-decode": (
                "statements that do not decode (a broken signature, a lease ending before it starts) and a claim"
                " breaking lease_length do not count",
                [torn], [C(2, m, 1, lease=3601),
                         forge(2, "claim", {**_body(C(2, m, 2)), "lease_expiry": NOW - 1})], [], 1, default),
            "claim-lease-boundaries": (
                "a claim is live from issued_at up to, not including, lease_expiry: step 0's expired at now, step 1's"
                " starts at now, step 2's starts after now, step 3's ends a second after now",
                [], [C(1, m, 0, issued_at=NOW - 120, lease=120), C(1, m, 1, issued_at=NOW, lease=60),
                     C(1, m, 2, issued_at=NOW + 1, lease=60), C(1, m, 3, issued_at=NOW - 1, lease=2)], [], 1, default),
            "future-attestation-counts": (
                "coverage does not judge dates: an attestation dated after now counts",
                [A(1, m, 0, issued_at=NOW + 3600)], [], [], 1, default),
            "copier-and-contradiction": (
                "quorum 2: key 5 copied step 1 and contradicts step 2's settled match: its flag is the contradiction",
                [A(1, m, 1), A(2, m, 1), copy(5, A(1, m, 1)), A(1, m, 2), A(2, m, 2), A(5, m, 2, match=False)], [],
                [R(1, m, 1)], 1, settle),
            "unbound-matches-do-not-settle": (
                "quorum 2: two unproven matches (nobody proved step 0) do not tie with two agreeing mismatches:"
                " the mismatch settles and step 0 is refuted",
                [A(3, m, 0, witness=unbound), A(4, m, 0, witness=unbound), A(5, m, 0, match=False),
                 A(6, m, 0, match=False)], [], [R(1, m, 0)], 1, settle),
            "copier-needs-a-counted-prover": (
                "allowlist: key 5 copied key 1's match, but key 1 is not counted: key 5 is not flagged, and its"
                " unproven match does not count", [A(1, m, 1), copy(5, A(1, m, 1))], [], [R(1, m, 1)], 1, roots(5)),
            "quorum-3": ("quorum 3: two agreeing mismatches do not settle step 0",
                         [A(1, m, 0), A(2, m, 0, match=False), A(3, m, 0, match=False)], [], [], 1,
                         {"name": "open", "roots": [], "quorum": 3}),
            "tie-does-not-settle": ("quorum 2: two matches and two agreeing mismatches: nothing settles, nobody is"
                                    " flagged", [A(1, m, 0), A(2, m, 0), A(3, m, 0, match=False),
                                                 A(4, m, 0, match=False)], [], [], 1, settle),
            "reveal-by-anyone": ("a reveal counts whoever signed it (the trust policy is for attestations)",
                                 [A(1, m, 1), copy(5, A(1, m, 1))], [], [R(7, m, 1)], 1, roots(1, 5)),
            "verified-over-claimed": ("a match makes a step verified even while a claim on it is live",
                                      [A(1, m, 0)], [C(2, m, 0)], [], 1, default),
            "copier-lowest-step": ("key 5 copied steps 1 and 2: its evidence is step 1's, citing the lowest of"
                                   " three reveals of step 1 (neither the first nor the last listed)",
                                   [A(1, m, 1), A(1, m, 2), copy(5, A(1, m, 1)), copy(5, A(1, m, 2))], [],
                                   [R(1, m, 2), *middle_lowest([R(1, m, 1), R(2, m, 1), R(3, m, 1)])], 1, default),
            "copier-cites-an-honest-prover": (
                f"keys 5 and {prover} each bound step 1 once and copied it once: both are copiers; the evidence"
                f" against key 5 cites key 1's proven match, though key {prover}'s has the lower digest",
                [A(1, m, 1), A(5, m, 1), copy(5, A(1, m, 1)), A(prover, m, 1), copy(prover, A(1, m, 1))], [],
                [R(1, m, 1)], 1, default),
            "copiers-do-not-vote": (
                "quorum 2: keys 5 and 6 copied step 0 (besides proving it), so their matches do not count when step 0"
                " is first settled: the two agreeing mismatches settle it, and the matching keys are flagged",
                [A(1, m, 0), A(5, m, 0), copy(5, A(1, m, 0)), A(6, m, 0), copy(6, A(1, m, 0)),
                 A(2, m, 0, match=False), A(3, m, 0, match=False)], [], [R(1, m, 0)], 1, settle),
            "untrusted-lists-valid-attesters": ("allowlist: an untrusted key with a valid attestation is listed, one"
                                                " whose only attestation breaks the run's rules is not",
                                                [A(1, m, 0), A(6, m, 0, pre_state=m.state_hashes[1]), A(7, m, 0)], [],
                                                [], 1, roots(1)),
            "other-run-statements": ("a reveal and a claim of another run (same step, same witness) do not count",
                                     [A(1, m, 1), copy(5, A(1, m, 1))], [C(3, other, 2)], [R(2, other, 1)], 1, default),
            "settled-before-self": ("quorum 2: a key reporting the settled result and another is flagged with its"
                                    " other result, citing an unflagged key's",
                                    [A(1, m, 0), A(2, m, 0), A(3, m, 0), A(3, m, 0, match=False)], [], [], 1, settle),
        }
        rules.update(CoverageSuite._evidence_choices(m, settle, default))
        for name, (description, atts, claims, reveals, redundancy, policy) in rules.items():
            case = {"description": description, "runs": one, "attestations": [hx(_bytes(a)) for a in atts],
                    "claims": [hx(_bytes(c)) for c in claims], "reveals": [hx(_bytes(r)) for r in reveals], "now": NOW,
                    "redundancy": redundancy, "policy": policy}
            out[name] = {**case, "result": CoverageSuite._result(case)}
        for name, entry in [*sets.items(), *policies.items()]:
            description, runs, atts, claims, redundancy, policy = (*entry, default)[:6]
            case = {"description": description, "runs": runs, "attestations": [hx(a.encoded) for a in atts],
                    "claims": [hx(c.encoded) for c in claims], "now": NOW, "redundancy": redundancy, "policy": policy}
            out[name] = {**case, "reveals": [], "result": CoverageSuite._result({**case, "reveals": []})}
        for name, (description, atts, reveals, redundancy, policy) in proofs.items():
            case = {"description": description, "runs": one, "attestations": [hx(a.encoded) for a in atts],
                    "claims": [], "reveals": [hx(r.encoded) for r in reveals], "now": NOW, "redundancy": redundancy,
                    "policy": policy}
            out[name] = {**case, "result": CoverageSuite._result(case)}
        for name, (description, atts, convictions, policy) in CoverageSuite._convictions(m, settle, default).items():
            case = {"description": description, "runs": one, "attestations": [hx(a.encoded) for a in atts],
                    "claims": [], "reveals": [], "convictions": convictions, "now": NOW, "redundancy": 1,
                    "policy": policy}
            out[name] = {**case, "result": CoverageSuite._result(case)}
        return out

    @staticmethod
    def _convictions(m, settle: dict, default: dict) -> dict[str, tuple]:
        """§8.3 with fraud proofs' convictions (§18.7): no trust, no quorum; the publisher's step
        refuted only when its trace reaches the published state; the fraud flag first."""
        A = fixtures.attestation
        other = blake2b256(b"vector-another-trace")

        def conv(key: int, step: int, proof: bytes, *, post: bytes | None = None, pre: bytes | None = None,
                 run: bytes | None = None) -> dict:
            return {"run": hx(run or m.run_id), "step": step, "guilty": hx(ident(key).public_key),
                    "pre_state": hx(pre or m.state_hashes[step]),
                    "post_state": hx(m.state_hashes[step + 1] if post is None else post),
                    "proof": hx(blake2b256(b"vector-proof", proof))}

        roots = {"name": "allowlist", "roots": [ident(n).peer_id for n in (1, 2, 3)], "quorum": 2}
        return {
            "fraud-refutes-publisher-step": (
                "two keys match step 1, but two proofs convict the publisher's trace, which reaches the published h_2:"
                " step 1 is refuted without a quorum, citing both proofs; the publisher's flag cites the lower",
                [A(1, m, 1), A(2, m, 1)], [conv(0, 1, b"x"), conv(0, 1, b"y")], default),
            "fraud-other-post-state": (
                "a proof convicts the publisher's trace of step 1 that does not reach the published h_2: its key is"
                " flagged, the step is not refuted", [A(1, m, 1)], [conv(0, 1, b"x", post=other)], default),
            "fraud-flags-auditor": (
                "a proof convicts key 1, which disputed step 1 and matched step 2, of a false op in a trace of step 2"
                " that reaches the published h_3: flagged, it counts nowhere; only the publisher's conviction refutes",
                [A(1, m, 1, match=False), A(1, m, 2), A(2, m, 2)], [conv(1, 2, b"x")], default),
            "fraud-needs-no-trust": (
                "allowlist, quorum 2: a proof convicts key 3, which a contradiction flag would cite, and the publisher"
                " (no root) at step 3: the fraud flags replace the contradiction flag, and step 3 is refuted",
                [A(1, m, 0), A(2, m, 0), A(3, m, 0, match=False)],
                [conv(3, 0, b"x", post=other), conv(0, 3, b"y")], roots),
            "fraud-out-of-settlement": (
                "quorum 2: keys 1 and 2 match step 0, keys 3 and 4 dissent; a proof convicts key 3: without it, step 0"
                " settles on the match and key 4 is flagged for contradicting it",
                [A(1, m, 0), A(2, m, 0), A(3, m, 0, match=False), A(4, m, 0, match=False)],
                [conv(3, 0, b"x", post=other)], settle),
            "fraud-not-of-this-run": (
                "convictions of another run, of another pre_state and of a step outside the run are not read",
                [A(1, m, 1)], [conv(0, 1, b"x", run=blake2b256(b"vector-other-run")),
                               conv(0, 1, b"y", pre=other),
                               {**conv(0, 3, b"z"), "step": m.steps}], default),
        }

    @staticmethod
    def _evidence_choices(m, settle: dict, default: dict) -> dict[str, tuple]:
        """§8.3 steps 5 and 8: which statement and which conflicting one each flag cites, the
        fallbacks when every other candidate is flagged included."""
        A, R, copy = fixtures.attestation, fixtures.reveal, fixtures.copied
        odd = blake2b256(b"vector-another-wrong")

        def below(step: int, *keys: int) -> int:  # a key whose match of step has a lower digest than these keys'
            return next(n for n in range(10, 400) if A(n, m, step).digest < min(A(k, m, step).digest for k in keys))

        low_self, low_copier = below(0, 1, 2), below(0, 1, 2)
        twice = [copy(5, A(1, m, 1)), copy(5, A(2, m, 1))]
        wrong = [A(4, m, 0, match=False), A(4, m, 0, match=False, post_state=odd)]
        return {
            "copier-fallback-to-a-copier": (
                "key 5 copied key 1's match of step 1, and key 1 copied key 2's of step 2: key 1, step 1's only other "
                "prover, is a copier too, so the flag of key 5 falls back to key 1's proven match",
                [A(1, m, 1), copy(5, A(1, m, 1)), A(2, m, 2), copy(1, A(2, m, 2))], [], [R(3, m, 1), R(3, m, 2)], 1,
                default),
            "copier-statement-lowest": (
                "key 5 copied step 1 twice (keys 1's and 2's matches): its flag cites the lower of its two unbound "
                "matches" + (" (the second listed)" if twice[1].digest < twice[0].digest else " (the first listed)"),
                [A(1, m, 1), A(2, m, 1), *twice], [], [R(3, m, 1)], 1, default),
            "contradiction-statement-lowest": (
                "quorum 2: keys 1 and 2 settle step 0; key 4 reported two other values: its flag cites the lower of "
                "its two mismatches" + (" (the second listed)" if wrong[1].digest < wrong[0].digest
                                         else " (the first listed)"),
                [A(1, m, 0), A(2, m, 0), *wrong], [], [], 1, settle),
            "contradiction-fallback-includes-itself": (
                f"quorum 2: keys 1, 2 and {low_self} settle step 0, and key {low_self} also reported another value; keys"
                f" 1 and 2 contradict step 1, which keys 3, 4 and 5 settle: every backer of step 0 is flagged, so key "
                f"{low_self}'s flag cites the lowest of all their matches, its own",
                [A(1, m, 0), A(2, m, 0), A(low_self, m, 0), A(low_self, m, 0, match=False), A(3, m, 1), A(4, m, 1),
                 A(5, m, 1), A(1, m, 1, match=False), A(2, m, 1, match=False)], [], [], 1, settle),
            "contradiction-backers-exclude-copiers": (
                f"quorum 2: keys 1 and 2 settle step 0 and key 6 dissents; key {low_copier}, whose match of step 0 has "
                f"the lowest digest, copied step 2: the flag of key 6 cites key 1's or 2's match, never a copier's",
                [A(1, m, 0), A(2, m, 0), A(low_copier, m, 0), A(6, m, 0, match=False), A(3, m, 2),
                 copy(low_copier, A(3, m, 2))], [], [R(3, m, 2)], 1, settle),
        }

    @staticmethod
    def _result(case: dict) -> dict:
        run = _runs(case)[0]
        p = case["policy"]
        policy = TrustPolicy(p["name"], frozenset(public_key_from_peer_id(r) for r in p["roots"]), p["quorum"])
        convictions = [Conviction(unhex(c["run"]), c["step"], unhex(c["guilty"]), unhex(c["pre_state"]),
                                  unhex(c["post_state"]), unhex(c["proof"])) for c in case.get("convictions", [])]
        cov = coverage(run, _decoded(Attestation, case["attestations"]), _decoded(Claim, case["claims"]),
                       reveals=_decoded(WitnessReveal, case["reveals"]), convictions=convictions, now=case["now"],
                       redundancy=case["redundancy"], policy=policy)
        return {"complete": cov.complete, "steps": [
            {"step": s.step, "status": s.status.value, "auditors": list(s.auditors), "dissenters": list(s.dissenters),
             "claimants": list(s.claimants), "evidence": [hx(d) for d in s.evidence], "devices": list(s.devices),
             "fraud_proofs": [hx(d) for d in s.fraud_proofs]}
            for s in cov.steps],
            "flagged": [{"signer": f.signer, "step": f.step, "kind": f.kind, "statement": hx(f.statement),
                         "conflicting": hx(f.conflicting), "reveal": hx(f.reveal) if f.reveal else None}
                        for f in cov.flagged],
            "untrusted": list(cov.untrusted)}

    @staticmethod
    def check(case: dict, root: Path) -> None:
        assert CoverageSuite._result(case) == case["result"]
