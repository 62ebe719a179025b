"""``spot`` vectors: spot coverage and the escape probability (docs/protocol.md §8.7).

Case: ``{"description", "runs", "attestations", "spotchecks", "policy", "now", "result"}``. The
replay coverage of ``runs[0]`` (§8.3, from ``attestations`` under ``policy``, redundancy 1, no
claims or reveals) gives ``replayed``, its verified or refuted steps; ``result`` is
``spot_coverage(run, spotchecks, policy, replayed)``: ``{"replayed", "steps": [{"step", "status",
"checkers", "caught", "evidence"}], "detection", "escape_one", "escape_fraction"}``. The three
numbers are exact fractions written ``"n/d"``: an implementation's floats must lie within a
relative 1e-9 of them (the escape probability is a sum of products, which no two orders of
summation round alike).
"""

from __future__ import annotations

from fractions import Fraction
from itertools import combinations
from math import comb, prod
from pathlib import Path

from open1b.protocol import (
    Attestation, SpotCheck, SpotStatus, TrustPolicy, coverage, derive_chunks, public_key_from_peer_id, spot_coverage,
)
from open1b.protocol.escape import forged_steps_at
from open1b.protocol.spotcheck import ESCAPE_FRACTION

from . import fixtures
from .common import NOW, hx, ident
from .suite_network import _decoded, _runs, resign

OPEN = {"name": "open", "roots": [], "quorum": 0}
SETTLE = {"name": "open", "roots": [], "quorum": 2}


def _policy(p: dict) -> TrustPolicy:
    return TrustPolicy(p["name"], frozenset(public_key_from_peer_id(r) for r in p["roots"]), p["quorum"])


def _exact_escape(checks: list[int], p: Fraction, forged: int, caught: set[int]) -> Fraction:
    """§8.7 step 5 with exact arithmetic, summed over every f-subset: the vectors' own reading of
    the formula, so that a case pins the number and not this implementation's rounding."""
    x = [Fraction(0) if k in caught else (1 - p) ** n for k, n in enumerate(checks)]
    return sum((prod(x[k] for k in subset) for subset in combinations(range(len(x)), forged)),
               Fraction(0)) / comb(len(x), forged)


def _fraction(value: Fraction) -> str:
    return f"{value.numerator}/{value.denominator}"


class SpotSuite:
    NAME = "spot"

    @staticmethod
    def cases() -> dict[str, dict]:
        sm, plain = fixtures.spot_manifest(), fixtures.run_manifest()
        long = fixtures.spot_manifest(steps=101)  # ⌈101 / 100⌉ = 2 forged steps for escape_fraction
        S, A = fixtures.spotcheck, fixtures.attestation
        one = [{"manifest": hx(sm.encoded)}]
        scenarios = {  # name -> (description, runs, attestations, spot checks, policy)
            "statuses": ("step 0 passed by two keys, step 1 failed (and passed by another key, which it still "
                         "lists), step 2 unchecked, step 3 passed by one key that signed twice (one check)", one, [],
                         [S(1, sm, 0), S(2, sm, 0), S(1, sm, 1), S(2, sm, 1, caught="update"), S(3, sm, 3),
                          S(3, sm, 3, issued_at=NOW - 60)], OPEN),
            "failed-is-caught": ("a failed step is caught: its x is 0, so one forged step escapes with 3/4", one, [],
                                 [S(2, sm, 0, caught="loss")], OPEN),
            "verified-is-caught": ("a step replay verified is caught (x = 0)", one, [A(1, sm, 2)], [S(1, sm, 0)], OPEN),
            "refuted-is-caught": ("quorum 2: two agreeing mismatches refute step 1, which is caught like a verified "
                                  "step; the lone match's key is flagged", one,
                                  [A(1, sm, 1), A(2, sm, 1, match=False), A(3, sm, 1, match=False)], [S(1, sm, 3)],
                                  SETTLE),
            "disputed-not-caught": ("quorum 0: a lone mismatch leaves step 3 disputed, which counts only its spot "
                                    "check (x = 3/4)", one, [A(2, sm, 3, match=False)], [S(1, sm, 3)], OPEN),
            "failed-and-passed-caught": ("a step with a fail and two passes is caught: its passes do not make its "
                                         "x (3/4)^2", one, [], [S(1, sm, 2), S(3, sm, 2), S(2, sm, 2, caught="sum")],
                                         OPEN),
            "fail-evidence": ("three fails of step 0 by two keys: caught lists each link once, evidence each fail's "
                              "digest, sorted", one, [],
                              [S(1, sm, 0, caught="update"), S(2, sm, 0, caught="loss"),
                               S(2, sm, 0, caught="update", issued_at=NOW - 5)], OPEN),
            "untrusted-not-counted": ("allowlist of key 1: key 2's fail and key 3's pass count for nothing", one, [],
                                      [S(1, sm, 0), S(2, sm, 1, caught="gradient"), S(3, sm, 2)],
                                      {"name": "allowlist", "roots": [ident(1).peer_id], "quorum": 0}),
            "invalid-not-counted": ("a spot check of another run, one whose slot its challenge does not select, and "
                                    "bytes that do not decode count for nothing", one, [],
                                    [S(1, fixtures.spot_manifest(publisher=3), 0),
                                     S(2, sm, 1, slot=(S(2, sm, 1).slot + 1) % 4), S(3, sm, 2)], OPEN),
            "dates-not-judged": ("a spot check dated a day after now still counts (dates are judged on arrival, §7)",
                                 one, [], [S(1, sm, 0, issued_at=NOW + 86400)], OPEN),
            "claims-not-judged": ("chunks_total and fingerprint are the signer's word: a pass that states 3 chunks "
                                  "and any fingerprint counts", one, [],
                                  [S(1, sm, 1, chunks_total=3, chunks=list(derive_chunks(
                                      S(1, sm, 1).challenge, 3)), fingerprint=bytes(32))], OPEN),
            "no-topology": ("a run whose model map names no topology: no spot check is valid, detection is 0, and "
                            "only the verified step is caught", [{"manifest": hx(plain.encoded)}], [A(1, plain, 0)],
                            [S(1, plain, 1)], OPEN),
            "escape-fraction": ("101 steps: escape_fraction is for ⌈101/100⌉ = 2 forged steps; steps 0-9 passed "
                                "twice, step 10 verified, step 11 failed", [{"manifest": hx(long.encoded)}],
                                [A(1, long, 10)],
                                [S(w, long, k) for k in range(10) for w in (1, 2)] + [S(3, long, 11, caught="loss")],
                                OPEN),
        }
        out = {}
        for name, (description, runs, atts, spots, policy) in scenarios.items():
            encoded = [hx(s.encoded) for s in spots]
            if name == "invalid-not-counted":
                encoded.append(hx(resign(spots[-1], verdict="maybe")))  # does not decode: no such verdict
            case = {"description": description, "runs": runs, "attestations": [hx(a.encoded) for a in atts],
                    "spotchecks": encoded, "policy": policy, "now": NOW}
            out[name] = {**case, "result": SpotSuite._result(case)}
        return out

    @staticmethod
    def _computed(case: dict):
        run = _runs(case)[0]
        policy = _policy(case["policy"])
        replay = coverage(run, _decoded(Attestation, case["attestations"]), now=case["now"], policy=policy)
        spot = spot_coverage(run, _decoded(SpotCheck, case["spotchecks"]), policy=policy,
                             replayed=replay.replayed_steps)
        return run, replay, spot

    @staticmethod
    def _result(case: dict) -> dict:
        run, replay, spot = SpotSuite._computed(case)
        p = Fraction(1, round(1 / spot.detection)) if spot.detection else Fraction(0)
        checks = [len(s.checkers) for s in spot.steps]
        caught = set(replay.replayed_steps) | {s.step for s in spot.steps if s.status is SpotStatus.FAILED}
        return {"replayed": replay.replayed_steps,
                "steps": [{"step": s.step, "status": s.status.value, "checkers": list(s.checkers),
                           "caught": list(s.caught), "evidence": [hx(d) for d in s.evidence]} for s in spot.steps],
                "detection": _fraction(p), "escape_one": _fraction(_exact_escape(checks, p, 1, caught)),
                "escape_fraction": _fraction(_exact_escape(
                    checks, p, forged_steps_at(ESCAPE_FRACTION, run.steps), caught))}

    @staticmethod
    def check(case: dict, root: Path) -> None:
        _, _, spot = SpotSuite._computed(case)
        want = case["result"]
        got = SpotSuite._result(case)
        assert {k: got[k] for k in ("replayed", "steps", "detection")} == {
            k: want[k] for k in ("replayed", "steps", "detection")}
        for name, value in (("detection", spot.detection), ("escape_one", spot.escape_one),
                            ("escape_fraction", spot.escape_fraction)):
            assert abs(value - float(Fraction(want[name]))) <= 1e-9 * float(Fraction(want[name])), name
