"""Suites ``validation``, ``claims`` and ``coverage``: how a node judges what peers send.

``validation`` case: ``{"description", "topic", "runs", "now", "message", "outcome", "reason"}``.
``topic`` is ``attestation``, ``claim``, ``reveal`` or ``manifest``; ``runs`` are the runs the validating node
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
    Attestation, Claim, ProtocolError, TrustPolicy, blake2b256, claim_key, claim_precedence, coverage, decode_message,
    WitnessReveal, encode, public_key_from_peer_id, resolve_external_run, select_claim_record, sign,
    validate_attestation, validate_claim, validate_claim_record, validate_manifest, validate_reveal,
)
from open1b.protocol.validation import MAX_CLOCK_SKEW_SECONDS

from . import fixtures
from .common import NOW, hx, ident, unhex


def forge(signer: int, kind: str, body: dict) -> bytes:
    """A correctly signed message whose body the constructors would refuse to build."""
    body = {"kind": kind, "v": 1, **body}
    return encode({**body, "sig": sign(ident(signer), kind, body)})


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
            "version": ("protocol version 2", forge(1, "attestation", {**_body(good), "v": 2})),
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
        }
        c = fixtures.claim(1, m, 1)
        claims = {
            "claim-accept": ("a live claim", c.encoded),
            "claim-lease-order": ("lease_expiry equal to issued_at", forge(1, "claim", {**_body(c), "lease_expiry": c.issued_at})),
            "claim-lease-length": ("a lease longer than MAX_LEASE_SECONDS", fixtures.claim(1, m, 1, lease=3601).encoded),
            "claim-step-range": ("a claim on a step the run does not have", fixtures.claim(1, m, 4).encoded),
            "claim-unknown-run": ("a claim on an unknown run", fixtures.claim(1, fixtures.run_manifest(publisher=3), 0).encoded),
            "claim-future": ("a claim issued in the future", fixtures.claim(1, m, 1, issued_at=NOW + 600).encoded),
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
        }
        out = {}
        for topic, group in (("attestation", att), ("claim", claims), ("reveal", reveals), ("manifest", manifests)):
            for name, (description, message) in group.items():
                case = {"description": description, "topic": topic, "runs": both if topic != "manifest" else [],
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
        return out

    @staticmethod
    def _result(case: dict) -> dict:
        run = _runs(case)[0]
        p = case["policy"]
        policy = TrustPolicy(p["name"], frozenset(public_key_from_peer_id(r) for r in p["roots"]), p["quorum"])
        cov = coverage(run, [Attestation.decode(unhex(a)) for a in case["attestations"]],
                       [Claim.decode(unhex(c)) for c in case["claims"]],
                       reveals=[WitnessReveal.decode(unhex(r)) for r in case["reveals"]], now=case["now"],
                       redundancy=case["redundancy"], policy=policy)
        return {"complete": cov.complete, "steps": [
            {"step": s.step, "status": s.status.value, "auditors": list(s.auditors), "dissenters": list(s.dissenters),
             "claimants": list(s.claimants), "evidence": [hx(d) for d in s.evidence]} for s in cov.steps],
            "flagged": [{"signer": f.signer, "step": f.step, "kind": f.kind, "statement": hx(f.statement),
                         "conflicting": hx(f.conflicting), "reveal": hx(f.reveal) if f.reveal else None}
                        for f in cov.flagged],
            "untrusted": list(cov.untrusted)}

    @staticmethod
    def check(case: dict, root: Path) -> None:
        assert CoverageSuite._result(case) == case["result"]
