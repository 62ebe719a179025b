"""Data proofs (docs/run-format.md §8) on random corpora: every honest proof holds, and each way
of forging an exclusion fails with its rule's code."""

import random

import pytest

from open1b.protocol.data_order import draws_between, sample_index
from open1b.protocol.data_proofs import proof_from_json, proof_to_json, verify_data_proof
from open1b.protocol.documents import (
    AbsenceProof, DataCommitments, InclusionProof, NeverDrawnProof, ProvenSample, SetNeighbour, document_digest, document_set_root,
    documents_root, prove_absent, prove_entry, sample_digest, sample_range,
)
from open1b.protocol.merkle import MerkleTree


def corpus(seed: int, *, docs: int = 20, steps: int = 4, sample_len: int = 6):
    rng = random.Random(seed)
    texts = [b"== d%d ==\n" % i + bytes(rng.randrange(97, 123) for _ in range(rng.randrange(1, 40))) for i in range(docs)]
    stream, entries = b"".join(texts), []
    for t in texts:
        start = entries[-1][1] if entries else 0
        entries.append((start, start + len(t), document_digest(t)))
    n = (len(stream) - 1) // (sample_len - 1)
    samples = [stream[i * (sample_len - 1):i * (sample_len - 1) + sample_len] for i in range(n)]
    tree = MerkleTree([sample_digest(s) for s in samples])
    c = DataCommitments(seed, steps, 2, 1, 2, sample_len, n, tree.root, docs, documents_root(entries),
                        document_set_root([e[2] for e in entries]))
    return texts, entries, samples, tree, c


def answer(c, texts, entries, samples, tree, i):
    entry = prove_entry(entries, i)
    held = sample_range(entry.start, entry.end, c.sample_len, c.samples)
    draws = draws_between(c.seed, range(c.steps), c.ranks, c.micro_batches, c.micro_batch_size, c.samples,
                          held.start, held.stop) if held else []
    if not draws:
        return NeverDrawnProof(entry)
    used = sorted({d.index for d in draws})
    return InclusionProof(entry, tuple(ProvenSample(s, samples[s], tuple(tree.proof(s))) for s in used), tuple(draws))


@pytest.mark.parametrize("seed", range(8))
def test_every_document_has_a_proof_that_holds_and_survives_json(seed):
    texts, entries, samples, tree, c = corpus(seed)
    kinds = set()
    for i, text in enumerate(texts):
        proof = answer(c, texts, entries, samples, tree, i)
        kinds.add(type(proof))
        assert verify_data_proof(c, text, proof).holds
        assert verify_data_proof(c, text, proof_from_json(proof_to_json(proof))).holds
        # the proof is about these bytes only: one more byte is another document
        assert not verify_data_proof(c, text + b"!", proof).holds
    for outsider in (b"", b"x", texts[0] + texts[1], texts[3][:-1]):
        proof = prove_absent(sorted(e[2] for e in entries), document_digest(outsider))
        assert verify_data_proof(c, outsider, proof).holds
    assert kinds == {InclusionProof, NeverDrawnProof}


def test_a_drawn_document_never_gets_an_exclusion():
    texts, entries, samples, tree, c = corpus(1)
    ordered = sorted(e[2] for e in entries)
    for i, text in enumerate(texts):
        proof = answer(c, texts, entries, samples, tree, i)
        k = ordered.index(entries[i][2])
        # no pair of leaves brackets a member: skipping it breaks adjacency, naming it breaks the order
        for lo, hi in ((k - 1, k + 1), (k - 1, k), (k, k + 1)):
            if 0 <= lo and hi < len(ordered):
                forged = AbsenceProof(_neighbour(ordered, lo), _neighbour(ordered, hi))
                assert verify_data_proof(c, text, forged).code in {"adjacent", "order"}
        if isinstance(proof, InclusionProof):
            assert verify_data_proof(c, text, NeverDrawnProof(proof.entry)).code == "drawn"


def _neighbour(ordered, j):
    return SetNeighbour(ordered[j], j, tuple(MerkleTree(ordered).proof(j)))


def test_draws_between_is_sample_index():
    hits = draws_between(5, range(3, 40), 2, 3, 2, 97, 10, 30)
    assert hits and all(10 <= d.index < 30 for d in hits)
    assert hits == [d for d in draws_between(5, range(3, 40), 2, 3, 2, 97, 0, 97) if 10 <= d.index < 30]
    assert all(sample_index(5, d.step, d.rank, d.micro_batch, d.row, 97) == d.index for d in hits)


def test_sample_range_is_the_samples_that_hold_a_token():
    for start in range(0, 30):
        for end in range(start + 1, 32):
            held = {s for s in range(10) if s * 4 < end and s * 4 + 5 > start}
            assert set(sample_range(start, end, 5, 10)) == held


def test_malformed_proofs_fail_without_raising():
    texts, entries, samples, tree, c = corpus(2)
    good = proof_to_json(answer(c, texts, entries, samples, tree, 0))
    with pytest.raises(ValueError):
        proof_from_json({**good, "entry": {**good["entry"], "index": "0"}})
    with pytest.raises(ValueError):
        proof_from_json({"kind": "maybe"})
    assert verify_data_proof(c, texts[0], "not a proof").code == "malformed"
    assert verify_data_proof(c, texts[0], AbsenceProof(None, None)).code == "neighbours"
