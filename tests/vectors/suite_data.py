"""``data`` and ``evaluation`` vectors (docs/run-format.md §8, docs/protocol.md §8.5–§8.6).

``data`` case: ``{"description", "commitments", "document", "proof", "holds", "code"}`` — checking
``proof`` (the JSON of docs/run-format.md §8.4) for the bytes ``document`` against
``commitments`` gives ``holds`` and ``code``. The case ``corpus`` instead spells out the synthetic
run: its stream, documents, sample digests, draws and the commitments they give.

``evaluation`` case: ``{"description", "runs", "attestations", "evals", "policy", "min_keys",
"evaluations", "leaderboard"}`` — the status of ``runs[0]``'s scheduled evaluations and the board
of every run, from those encoded statements.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from open1b.protocol import TrustPolicy, decode_message, evaluations, leaderboard, public_key_from_peer_id
from open1b.protocol.data_order import draws_between
from open1b.protocol.data_proofs import proof_from_json, proof_to_json, verify_data_proof
from open1b.protocol.documents import (
    AbsenceProof, DataCommitments, InclusionProof, NeverDrawnProof, ProvenSample, SetNeighbour, document_digest,
    document_set_root, documents_root, prove_absent, prove_entry, sample_digest, sample_range,
)
from open1b.protocol.merkle import MerkleTree

from . import fixtures
from .common import NOW, hx, ident, unhex

SEED, STEPS, TOPOLOGY, L = 11, 3, (1, 2, 2), 5  # 12 draws of samples of 5 bytes (stride 4)
BOUNDARY_SEED = 21
"""The same corpus drawn with another seed, under which sample 12 (whose last token is the first of
document 2, which starts at a sample boundary) and sample 33 (whose first token is the last of
document 4, which ends at one) are both drawn."""
BODIES = [b"alpha", b"the quick brown fox", b"x", b"lorem ipsum dolor sit amet", b"twelve bytes", b"y" * 30,
          b"zeta", b"omega point", b"gamma ray burst", b"delta", b"epsilon is small", b"last one"]


def _corpus(seed: int = SEED):
    docs = [b"== doc.%d ==\n" % i + body + b"\n\n" for i, body in enumerate(BODIES)]
    stream = b"".join(docs)
    entries, at = [], 0
    for d in docs:
        entries.append((at, at + len(d), document_digest(d)))
        at += len(d)
    n = (len(stream) - 1) // (L - 1)
    samples = [stream[i * (L - 1):i * (L - 1) + L] for i in range(n)]
    digests = [sample_digest(s) for s in samples]
    c = DataCommitments(seed, STEPS, *TOPOLOGY, L, n, MerkleTree(digests).root, len(docs), documents_root(entries),
                        document_set_root([e[2] for e in entries]))
    return docs, entries, samples, c


def _commitments_json(c: DataCommitments) -> dict:
    return {"seed": c.seed, "steps": c.steps, "ranks": c.ranks, "micro_batches": c.micro_batches,
            "micro_batch_size": c.micro_batch_size, "sample_len": c.sample_len, "samples": c.samples,
            "samples_root": hx(c.samples_root), "document_count": c.document_count,
            "documents_root": hx(c.documents_root), "document_set_root": hx(c.document_set_root)}  # fmt: skip


def _commitments(value: dict) -> DataCommitments:
    return DataCommitments(**{k: unhex(v) if isinstance(v, str) else v for k, v in value.items()})


def _judge(c: DataCommitments, document: bytes, proof: dict) -> tuple[bool, str]:
    """run-format §8.5: a proof whose JSON does not parse is ``malformed``, before any rule."""
    try:
        parsed = proof_from_json(proof)
    except ValueError:
        return False, "malformed"
    check = verify_data_proof(c, document, parsed)
    return check.holds, check.code


def _draws(c: DataCommitments, entry) -> list:
    held = sample_range(entry.start, entry.end, c.sample_len, c.samples)
    return draws_between(c.seed, range(c.steps), c.ranks, c.micro_batches, c.micro_batch_size, c.samples,
                         held.start, held.stop) if held else []  # fmt: skip


class DataSuite:
    NAME = "data"

    @staticmethod
    def cases() -> dict[str, dict]:
        docs, entries, samples, c = _corpus()
        tree = MerkleTree([sample_digest(s) for s in samples])
        ordered = sorted(e[2] for e in entries)

        def entry(i: int):
            return prove_entry(entries, i)

        def inclusion(i: int, c: DataCommitments = c) -> InclusionProof:
            draws = _draws(c, entry(i))
            used = sorted({d.index for d in draws})
            return InclusionProof(entry(i), tuple(ProvenSample(s, samples[s], tuple(tree.proof(s))) for s in used),
                                  tuple(draws))

        drawn = [i for i in range(len(docs)) if _draws(c, entry(i))]  # fmt: skip
        never = [i for i in range(len(docs)) if not _draws(c, entry(i))]
        assert len(drawn) >= 2 and len(never) >= 2, "the synthetic run must have both kinds of document"
        d, n = max(drawn, key=lambda i: len(_draws(c, entry(i)))), never[0]
        assert len(_draws(c, entry(d))) >= 2, "one document must be drawn twice, to leave a draw out"
        inc = inclusion(d)
        outsider = b"== doc.99 ==\nnot in this corpus\n\n"
        near = docs[n][:-1] + b" \n"  # one byte off a document of the corpus: another document
        k = ordered.index(document_digest(docs[n]))  # that document's leaf in the sorted set

        def neighbour(j: int) -> SetNeighbour:
            return SetNeighbour(ordered[j], j, tuple(MerkleTree(ordered).proof(j)))

        first, last = min(ordered), max(ordered)
        below = next(x for x in (b"before %d" % i for i in range(1000)) if document_digest(x) < first)
        above = next(x for x in (b"after %d" % i for i in range(1000)) if document_digest(x) > last)
        later = 4  # drawn at sample 27 only: not the first (26) nor the last (33) of its range
        assert [x.index for x in _draws(c, entry(later))] == [27]
        bc = _corpus(BOUNDARY_SEED)[3]
        assert {12, 33} <= {x.index for i in (2, 4) for x in _draws(bc, entry(i))}
        assert entries[2][0] % (L - 1) == 0 and (entries[4][1] - 1) % (L - 1) == 0
        shifted = [(s + 1, e + 1, dg) if i == d else (s, e, dg) for i, (s, e, dg) in enumerate(entries)]
        lying = replace(c, documents_root=documents_root(shifted))  # a documents_root the samples do not back
        lied = prove_entry(shifted, d)
        mid_held = sample_range(lied.start, lied.end, L, c.samples)[2]  # inside the text, where bytes differ
        cases: dict[str, tuple[str, bytes, object]] = {
            "included": ("a drawn document: every draw of its samples, each sample proven", docs[d], inc),
            "included-second": ("another drawn document", docs[drawn[1]], inclusion(drawn[1])),
            "never-drawn": ("in the corpus, and no step drew a sample holding it", docs[n], NeverDrawnProof(entry(n))),
            "absent": ("not in the corpus: its sorted neighbours", outsider, prove_absent(ordered, document_digest(outsider))),
            "absent-near-duplicate": ("one byte off a corpus document is not in the corpus (no normalisation)",
                                      near, prove_absent(ordered, document_digest(near))),
            "forged-absent-member": ("FORGED exclusion: an absence proof for a corpus document, by skipping its leaf",
                                     docs[n], AbsenceProof(neighbour(k - 1), neighbour(k + 1)) if 0 < k < len(ordered) - 1
                                     else AbsenceProof(neighbour(0), neighbour(2))),
            "forged-absent-equal": ("FORGED exclusion: the document itself as its upper neighbour", docs[n],
                                    AbsenceProof(neighbour(k - 1) if k else None, neighbour(k))),
            "forged-absent-fake-leaf": ("FORGED exclusion: a neighbour that is not a leaf of the sorted set", docs[n],
                                        AbsenceProof(SetNeighbour(bytes(32), 0, neighbour(0).path), None)),
            "forged-never-drawn": ("FORGED exclusion: a never-drawn proof for a document a step drew", docs[d],
                                   NeverDrawnProof(entry(d))),
            "forged-never-drawn-other-entry": ("FORGED exclusion: the entry of another, undrawn document", docs[d],
                                               NeverDrawnProof(entry(n))),
            "absent-no-neighbour": ("an absence proof without neighbours", outsider, AbsenceProof(None, None)),
            "absent-not-first": ("only an upper neighbour, which is not leaf 0", below,
                                 AbsenceProof(None, neighbour(1))),
            "absent-before-first": ("before the first leaf: only an upper neighbour, leaf 0", below,
                                    AbsenceProof(None, neighbour(0))),
            "included-missing-draw": ("an inclusion proof that leaves a draw out", docs[d],
                                      InclusionProof(inc.entry, inc.samples, inc.draws[:-1])
                                      if len(inc.draws) > 1 else InclusionProof(inc.entry, inc.samples, ())),
            "included-tampered-sample": ("a proven sample whose tokens were changed", docs[d], InclusionProof(
                inc.entry, (ProvenSample(inc.samples[0].index, b"X" * L, inc.samples[0].path),) + inc.samples[1:],
                inc.draws)),
            "included-wrong-draw": ("a draw the rule does not give", docs[d], InclusionProof(inc.entry, inc.samples, (
                type(inc.draws[0])(inc.draws[0].step, inc.draws[0].rank, inc.draws[0].micro_batch,
                                   1 - inc.draws[0].row, inc.draws[0].index),) + inc.draws[1:])),
            "included-no-draw": ("an inclusion proof with no draw", docs[n], InclusionProof(entry(n), (), ())),
            "entry-wrong-range": ("an entry whose range is not the document's length", docs[n], NeverDrawnProof(
                type(entry(n))(n, entries[n][0], entries[n][1] + 1, entry(n).path))),
            "absent-after-last": ("after the last leaf: only a lower neighbour, leaf D - 1", above,
                                  AbsenceProof(neighbour(len(ordered) - 1), None)),
            "absent-not-last": ("only a lower neighbour, which is not leaf D - 1", above,
                                AbsenceProof(neighbour(len(ordered) - 2), None)),
            "included-unsorted-draws": ("every draw, listed out of (k, r, mu, j) order: incomplete", docs[d],
                                        InclusionProof(inc.entry, inc.samples, tuple(reversed(inc.draws)))),
            "forged-never-drawn-later-sample": ("FORGED exclusion: a never-drawn proof for a document whose first and "
                                                "last samples were not drawn, but one between them was", docs[later],
                                                NeverDrawnProof(entry(later))),
            "included-sample-not-the-document": (
                "rule 3: a trainer's documents_root places the document one token later than the samples hold it; "
                "entry and samples verify, and the sample's tokens are not the document's bytes", docs[d],
                InclusionProof(lied, (ProvenSample(mid_held, samples[mid_held], tuple(tree.proof(mid_held))),),
                               ())),
        }
        boundary = {  # name -> (description, document index): under BOUNDARY_SEED
            "included-starts-at-boundary": ("a document that starts at a sample boundary (byte 52 = 13 x 4): its "
                                            "first token is the last of sample 12, which a step drew", 2),
            "included-ends-at-boundary": ("a document whose last token (byte 132 = 33 x 4) is the first of sample "
                                          "33, which a step drew", 4),
        }
        malformed = {  # name -> (description, document, proof JSON)
            "malformed-before-entry": ("a malformed proof (tokens that are not hex) whose entry is wrong too: "
                                       "malformed decides, before rule 1", docs[d], {
                                           **proof_to_json(inc), "entry": {**proof_to_json(inc)["entry"], "end": 0},
                                           "samples": [{**proof_to_json(inc)["samples"][0], "tokens": "zz"}]}),
            "malformed-upper-case": ("a hash in upper-case hex is malformed (hashes and tokens are lowercase)",
                                     docs[n], {"kind": "never_drawn", "entry": {
                                         **proof_to_json(NeverDrawnProof(entry(n)))["entry"],
                                         "path": [h.hex().upper() for h in entry(n).path]}}),
            "malformed-kind": ("a proof of no known kind", docs[n], {"kind": "maybe", "entry": proof_to_json(
                NeverDrawnProof(entry(n)))["entry"]}),
            "malformed-float-index": ("an index written 2.0 is not an integer", docs[n], {"kind": "never_drawn",
                                      "entry": {**proof_to_json(NeverDrawnProof(entry(n)))["entry"], "index": 2.0}}),
        }
        out = {"corpus": {
            "description": "the synthetic run: stream, documents, sample digests, every draw, and its commitments",
            "stream": hx(b"".join(docs)), "documents": [[s, e, hx(dg)] for s, e, dg in entries],
            "sample_digests": [hx(sample_digest(s)) for s in samples],
            "draws": [[x.step, x.rank, x.micro_batch, x.row, x.index] for x in draws_between(
                SEED, range(STEPS), *TOPOLOGY, c.samples, 0, c.samples)],
            "commitments": _commitments_json(c)}}
        judged = [(name, description, c, document, proof_to_json(proof))
                  for name, (description, document, proof) in cases.items()]
        judged[-1] = (*judged[-1][:2], lying, *judged[-1][3:])  # rule 3's case is judged against the lying root
        judged += [(name, description, bc, docs[i], proof_to_json(inclusion(i, bc)))
                   for name, (description, i) in boundary.items()]
        judged += [(name, description, c, document, proof) for name, (description, document, proof) in malformed.items()]
        for name, description, commitments, document, proof in judged:
            holds, code = _judge(commitments, document, proof)
            out[name] = {"description": description, "commitments": _commitments_json(commitments),
                         "document": hx(document), "proof": proof, "holds": holds, "code": code}
        return out

    @staticmethod
    def check(case: dict, root: Path) -> None:
        c = _commitments(case["commitments"])
        if "proof" not in case:
            _, entries, samples, built = _corpus()
            assert built == c and [[s, e, hx(d)] for s, e, d in entries] == case["documents"]
            return
        assert _judge(c, unhex(case["document"]), case["proof"]) == (case["holds"], case["code"])


def _row(row) -> dict:
    """A board row without its two floats (loss: its float32 bits are there; replayed: the counts are)."""
    out = {**row.to_json(), "run": hx(row.run)}
    del out["loss"], out["replayed"]
    return out


class EvaluationSuite:
    NAME = "evaluation"

    @staticmethod
    def cases() -> dict[str, dict]:
        em, other = fixtures.eval_manifest(), fixtures.eval_manifest(steps=6)
        plain = fixtures.run_manifest()
        ev = fixtures.evaluation

        def res(run, k, loss=fixtures.LOSS):
            return ev(0, run, k, verdict="result", loss=loss, claimed=loss)

        def ok(run, who, k, loss=fixtures.LOSS):
            return ev(who, run, k, loss=loss, claimed=loss)

        verified = [fixtures.attestation(w, em, s) for s in range(4) for w in (1, 2)]
        scenarios = {
            "certified": ("a result and two matching keys: certified at m = 2; state 4 has no result",
                          [em], verified, [res(em, 2), ok(em, 1, 2), ok(em, 2, 2)], 2, None),
            "too-few-keys": ("one matching key where m = 2: unchecked", [em], [], [res(em, 2), ok(em, 1, 2)], 2, None),
            "mismatch": ("a key recomputed another loss: disputed", [em], [],
                         [res(em, 2), ok(em, 1, 2), ev(2, em, 2, verdict="mismatch", loss=fixtures.LOSS + 1)], 1, None),
            "two-results": ("the publisher signed two losses for one state: disputed", [em], [],
                            [res(em, 2), res(em, 2, fixtures.LOSS + 1), ok(em, 1, 2)], 1, None),
            "check-of-another-number": ("a match of a loss nobody published counts for nothing", [em], [],
                                        [res(em, 2), ok(em, 1, 2, fixtures.LOSS + 7)], 1, None),
            "mismatch-of-another-number": ("a mismatch of a loss nobody published disputes nothing: the result "
                                           "stays certified", [em], [],
                                           [res(em, 2), ok(em, 1, 2), ev(2, em, 2, verdict="mismatch",
                                                                         loss=fixtures.LOSS, claimed=fixtures.LOSS + 7)],
                                           1, None),
            "dates-not-judged": ("evaluations do not judge dates: a match dated a day after now certifies", [em], [],
                                 [res(em, 2), ev(1, em, 2, issued_at=NOW + 86400)], 1, None),
            "untrusted-key": ("under an allowlist, a key outside it does not certify", [em], [],
                              [res(em, 2), ok(em, 3, 2)], 1, [1, 2]),
            "invalid-ignored": ("an eval off the schedule and one of a run without evaluation are dropped",
                                [em, plain], [], [res(em, 2), ok(em, 1, 2), ok(em, 2, 3), ok(plain, 1, 2)], 1, None),
            "board": ("two runs on one evaluation set, ranked by certified loss; a third with a disputed step is "
                      "listed, unranked", [em, other, fixtures.eval_manifest(steps=8)],
                      verified + [fixtures.attestation(1, fixtures.eval_manifest(steps=8), 0, match=False)],
                      [res(em, 2), ok(em, 1, 2), res(em, 4, 0x40000000), ok(em, 2, 4, 0x40000000),
                       res(other, 6, 0x3f800000), ok(other, 1, 6, 0x3f800000),
                       res(fixtures.eval_manifest(steps=8), 2), ok(fixtures.eval_manifest(steps=8), 1, 2)], 1, None),
        }
        scenarios.update(EvaluationSuite._board_rules())
        out = {}
        for name, (description, runs, atts, evals, min_keys, roots, *quorum) in scenarios.items():
            case = {"description": description, "runs": [hx(r.encoded) for r in runs],
                    "attestations": [hx(a.encoded) for a in atts], "evals": [hx(e.encoded) for e in evals],
                    "policy": {"name": "open" if roots is None else "allowlist",
                               "roots": [ident(i).peer_id for i in roots or ()], "quorum": quorum[0] if quorum else 0},
                    "now": NOW, "min_keys": min_keys}  # fmt: skip
            out[name] = {**case, **EvaluationSuite._result(case)}
        return out

    @staticmethod
    def _board_rules() -> dict[str, tuple]:
        """One case per rule of §8.6 that a reading of the text could get wrong."""
        ev, A = fixtures.evaluation, fixtures.attestation
        em = fixtures.eval_manifest
        a, b, c, d = em(), em(steps=6), em(steps=8), em(steps=10)
        nan, one, two, three = 0x7FC00000, 0x3F800000, 0x40000000, 0x40400000

        def certified(run, k, loss, checker=1):
            return [ev(0, run, k, verdict="result", loss=loss, claimed=loss), ev(checker, run, k, loss=loss, claimed=loss)]

        other_set = em(eval_set=b"vector-eval-set-2")
        refuted = [A(1, a, 0), A(2, a, 0, match=False), A(3, a, 0, match=False)]
        return {
            "latest-not-best": ("the latest certified loss is ranked, not the best: run a fell to 1.0 at state 2 and "
                                "rose to 3.0 at state 4, so run b's 2.0 ranks first", [a, b], [],
                                certified(a, 2, one) + certified(a, 4, three) + certified(b, 6, two), 1, None),
            "nan-latest": ("a NaN latest certified loss is not ranked, although an earlier certified loss was finite",
                           [a, b], [], certified(a, 2, one) + certified(a, 4, nan) + certified(b, 6, two), 1, None),
            "reason-order": ("each unranked run names the first rule it fails: a (no certified evaluation, and a "
                             "disputed step), b (a NaN loss and a disputed evaluation), c (a disputed evaluation and a "
                             "disputed step)", [a, b, c], [A(2, a, 1, match=False), A(2, c, 1, match=False)],
                             [ev(0, a, 2, verdict="result", loss=one, claimed=one)] + certified(b, 6, nan)
                             + [ev(0, b, 2, verdict="result", loss=one, claimed=one),
                                ev(2, b, 2, verdict="mismatch", loss=two, claimed=one)]
                             + certified(c, 2, one) + [ev(0, c, 4, verdict="result", loss=one, claimed=one),
                                                       ev(2, c, 4, verdict="mismatch", loss=two, claimed=one)], 1, None),
            "eval-sets": ("ranks count within each evaluation set: a and b on one set, d on another, each set from 1; "
                          "d's higher loss still ranks 1st on its set", [a, b, other_set], [],
                          certified(a, 2, two) + certified(b, 6, one) + certified(other_set, 4, three), 1, None),
            "tie": ("equal losses: ordered by run ID bytewise, with distinct ranks", [a, b, d], [],
                    certified(a, 2, two) + certified(b, 2, two) + certified(d, 2, two), 1, None),
            "refuted-never-ranked": ("quorum 2: two agreeing mismatches refute run a's step 0 (its one match's key is "
                                     "flagged); a is not ranked though its loss is the lowest, and b is ranked 1st",
                                     [a, b], refuted, certified(a, 2, one) + certified(b, 6, two), 1, None, 2),
            "devices-of-verified-steps": ("devices are those of the verified steps: a cuda match of a disputed step "
                                          "adds none", [a],
                                          [A(1, a, 0), A(1, a, 1, device="cuda/sm_90"), A(2, a, 1, match=False)],
                                          certified(a, 2, one), 1, None),
        }

    @staticmethod
    def _result(case: dict) -> dict:
        runs = [decode_message(unhex(r)) for r in case["runs"]]
        atts = [decode_message(unhex(a)) for a in case["attestations"]]
        evs = [decode_message(unhex(e)) for e in case["evals"]]
        p = case["policy"]
        policy = TrustPolicy(p["name"], frozenset(public_key_from_peer_id(r) for r in p["roots"]), p["quorum"])
        status = evaluations(runs[0], evs, policy=policy, min_keys=case["min_keys"])
        board = leaderboard(runs, atts, evs, now=case["now"], policy=policy, min_keys=case["min_keys"])
        return {"evaluations": [{"state": e.state, "status": e.status.value, "loss": e.loss, "checkers": list(e.checkers),
                                 "dissenters": list(e.dissenters), "evidence": [hx(d) for d in e.evidence],
                                 "devices": list(e.devices)} for e in status],
                "leaderboard": [_row(r) for r in board]}  # fmt: skip

    @staticmethod
    def check(case: dict, root: Path) -> None:
        assert EvaluationSuite._result(case) == {k: case[k] for k in ("evaluations", "leaderboard")}

