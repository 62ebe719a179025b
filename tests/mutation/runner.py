"""Checks one vector case against a reading of the spec (``reference.py`` or a mutant of it).

``failure(ref, suite, case)`` is None when the reading gives what the case expects, else why not.
The suites and their case formats are those of tests/vectors/README.md; this module reads the
files, never the code that generated them.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import nacl.signing

from ..vectors.common import typed, unhex, untyped

VECTORS = Path(__file__).resolve().parents[1] / "vectors"
SUITES = ("codec", "signing", "validation", "claims", "coverage", "trajectory", "evaluation", "spot", "data")


def cases(suite: str) -> list[tuple[str, dict]]:
    return [(p.stem, json.loads(p.read_text())) for p in sorted((VECTORS / suite).glob("*.json"))]


def _codec(ref: ModuleType, c: dict):
    data = unhex(c["encoded"])
    try:
        value = ref.decode(data, c["max_size"])
    except ref.Refused as exc:
        return "error" in c and exc.code == c["error"] or f"refused {exc.code}"
    return "value" in c and typed(value) == c["value"] and ref.encode(untyped(c["value"])) == data or "accepted"


def _signing(ref: ModuleType, c: dict):
    if "valid" in c:
        return ref.ed25519_valid(unhex(c["public_key"]), unhex(c["message"]), unhex(c["signature"])) == c["valid"]
    key = nacl.signing.SigningKey(unhex(c["seed"]))
    if ref.peer_id(bytes(key.verify_key)) != c["peer_id"]:
        return "peer ID"
    if "public_key" in c:
        return bytes(key.verify_key) == unhex(c["public_key"])
    body = untyped(c["body"])
    data = ref.signing_bytes(c["kind"], body)
    if data != unhex(c["signing_bytes"]) or key.sign(data).signature != unhex(c["signature"]):
        return "signing bytes or signature"
    try:
        m = ref.decode_message(unhex(c["encoded"]), {c["kind"]})
    except ref.Refused as exc:
        return f"refused {exc.code}"
    return m["digest"] == unhex(c["digest"]) and ref.encode({**body, "sig": m["sig"]}) == unhex(c["encoded"])


def _runs(ref: ModuleType, c: dict) -> list[dict]:
    return [ref.load_run(unhex(r["manifest"]), unhex(r["trajectory"]) if "trajectory" in r else None) for r in c["runs"]]


def _validation(ref: ModuleType, c: dict):
    runs = {run["id"]: run for run in _runs(ref, c)}
    got = ref.validate(c["topic"], unhex(c["message"]), runs, c["now"])
    return got == (c["outcome"], c["reason"]) or f"{got}"


def _claims(ref: ModuleType, c: dict):
    records = [ref.claim_record(c["key"], unhex(r)) for r in c["records"]]
    if [r is not None for r in records] != c["valid"]:
        return "validity"
    order = sorted((i for i, r in enumerate(records) if r is not None), key=lambda i: ref.claim_rank(records[i]))
    return order == c["order"] and (order[0] if order else None) == c["winner"] or f"order {order}"


def _coverage(ref: ModuleType, c: dict):
    p = c["policy"]
    convictions = [{k: v if k == "step" else unhex(v) for k, v in conv.items()} for conv in c.get("convictions", [])]
    got = ref.coverage(_runs(ref, c)[0], [unhex(a) for a in c["attestations"]], [unhex(x) for x in c["claims"]],
                       [unhex(r) for r in c["reveals"]], c["now"], c["redundancy"], p, convictions)
    hexed = lambda d: None if d is None else "0x" + d.hex()  # noqa: E731
    result = {"complete": got["complete"],
              "steps": [{**{k: v for k, v in s.items() if k != "attesters"}, "evidence": [hexed(d) for d in s["evidence"]],
                         "fraud_proofs": [hexed(d) for d in s["fraud_proofs"]]}
                        for s in got["steps"]],
              "flagged": [{**f, "statement": hexed(f["statement"]), "conflicting": hexed(f["conflicting"]),
                           "reveal": hexed(f["reveal"])} for f in got["flagged"]],
              "untrusted": got["untrusted"]}
    return result == c["result"] or "result differs"


def _trajectory(ref: ModuleType, c: dict):
    try:
        run = ref.load_run(unhex(c["manifest"]), unhex(c["trajectory"]))
    except ref.Refused as exc:
        return c["result"].get("error") == exc.code or f"refused {exc.code}"
    want = c["result"]
    return "error" not in want and ["0x" + h.hex() for h in run["h"]] == want["state_hashes"] or "resolved"


def _hexed(value):
    """The vectors' JSON of a reading's result: bytes as 0x-hex, inside lists and maps too."""
    if isinstance(value, bytes):
        return "0x" + value.hex()
    if isinstance(value, list):
        return [_hexed(v) for v in value]
    if isinstance(value, dict):
        return {k: _hexed(v) for k, v in value.items()}
    return value


def _evaluation(ref: ModuleType, c: dict):
    runs = [ref.load_run(unhex(r)) for r in c["runs"]]
    atts, evals = [unhex(a) for a in c["attestations"]], [unhex(e) for e in c["evals"]]
    got = {"evaluations": ref.evaluations(runs[0], evals, c["policy"], c["min_keys"]),
           "leaderboard": ref.leaderboard(runs, atts, evals, c["now"], c["policy"], c["min_keys"])}
    return _hexed(got) == {k: c[k] for k in ("evaluations", "leaderboard")} or "result differs"


def _spot(ref: ModuleType, c: dict):
    run = _runs(ref, c)[0]
    replayed = ref.replayed_steps(run, [unhex(a) for a in c["attestations"]], c["now"], c["policy"])
    got = ref.spot_coverage(run, [unhex(s) for s in c["spotchecks"]], replayed, c["policy"])
    fraction = lambda f: f"{f.numerator}/{f.denominator}"  # noqa: E731
    result = {"replayed": replayed, "steps": _hexed(got["steps"]),
              **{k: fraction(got[k]) for k in ("detection", "escape_one", "escape_fraction")}}
    return result == c["result"] or "result differs"


def _data(ref: ModuleType, c: dict):
    if "proof" not in c:
        return True  # the corpus: what the other cases are about, nothing to judge
    commitments = {k: unhex(v) if isinstance(v, str) else v for k, v in c["commitments"].items()}
    code = ref.data_proof(commitments, unhex(c["document"]), c["proof"])
    return (code == "ok", code) == (c["holds"], c["code"]) or code


CHECKS = {"data": _data, "codec": _codec, "signing": _signing, "validation": _validation, "claims": _claims,
          "coverage": _coverage, "trajectory": _trajectory, "evaluation": _evaluation, "spot": _spot}


def failure(ref: ModuleType, suite: str, case: dict) -> str | None:
    """None if ``ref`` gives what ``case`` expects; otherwise a short reason (an exception counts)."""
    try:
        ok = CHECKS[suite](ref, case)
    except Exception as exc:  # a wrong reading may also crash: that, too, fails the case
        return f"{type(exc).__name__}: {exc}"
    return None if ok is True else (ok or "differs")
