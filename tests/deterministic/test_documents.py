"""The documents of the shipped corpus, the held-out split, the draw index and ``data`` answers
for a run directory (docs/run-format.md §8–§9)."""

import numpy as np
import pytest

from open1b.deterministic.data import builtin_corpus_bytes, builtin_split
from open1b.deterministic.data_index import INDEX_FILE, DrawIndex, load_or_build
from open1b.deterministic.document_proofs import prove_document
from open1b.deterministic.documents import CorpusSplit, Documents, document_starts
from open1b.deterministic.errors import SamplesMismatchError
from open1b.protocol import Identity, RunManifest, blake2b256
from open1b.protocol.data_order import draws_between
from open1b.protocol.documents import document_digest
from tests.runs import corpus_run, run_manifest


def test_the_split_rule_gives_build_py_s_documents():
    corpus = builtin_corpus_bytes()
    starts = document_starts(corpus)
    docs = [corpus[s:e] for s, e in zip(starts, starts[1:] + [len(corpus)])]
    assert len(docs) == 3746 and b"".join(docs) == corpus
    # build.py step 4: "== name ==\n" + docstring + "\n\n", every docstring distinct (step 3)
    assert all(d.startswith(b"== ") and d.endswith(b"\n\n") and b" ==\n" in d for d in docs)
    assert len({document_digest(d) for d in docs}) == len(docs)


def test_a_header_inside_a_document_and_adjacent_headers():
    stream = b"== a ==\nx\n\n== b ==\n\n== c ==\ny == z ==\n\n==  ==\n"
    assert document_starts(stream) == [0, 11, 20, 39]
    assert document_starts(b"") == []


def test_held_out_documents_are_the_corpus_s_last():
    split = builtin_split(8)
    assert split.train + split.evaluation == builtin_corpus_bytes()
    assert len(document_starts(split.evaluation)) == 8
    assert len(Documents.of(split.train).entries) == 3738
    with pytest.raises(ValueError):
        CorpusSplit.of(builtin_corpus_bytes(), 3746)


def test_draw_index_is_the_draw_rule_and_its_file_is_checked(tmp_path):
    key = dict(run=bytes(32), seed=9, steps=300, topology=(2, 2, 2), samples=500)
    index = DrawIndex.build(**key)
    for first, stop in ((0, 1), (17, 40), (499, 500), (0, 500)):
        assert index.draws(first, stop) == draws_between(9, range(300), 2, 2, 2, 500, first, stop)
    assert index.draws(5, 5) == []
    loaded = load_or_build(tmp_path, **key)  # builds and writes
    assert (tmp_path / INDEX_FILE).exists() and np.array_equal(loaded.positions, index.positions)
    data = bytearray((tmp_path / INDEX_FILE).read_bytes())
    data[100] ^= 1  # a corrupted offset: refused, rebuilt, rewritten
    (tmp_path / INDEX_FILE).write_bytes(bytes(data))
    assert load_or_build(tmp_path, **key).draws(17, 40) == index.draws(17, 40)
    assert (tmp_path / INDEX_FILE).read_bytes() == index.encode()
    other = load_or_build(tmp_path, **{**key, "seed": 10})  # another run's index is not used
    assert other.draws(0, 500) == draws_between(10, range(300), 2, 2, 2, 500, 0, 500)


def test_answers_for_a_run_directory(tmp_path):
    _, manifest = corpus_run(tmp_path, steps=3)
    docs = Documents.of(builtin_split(0).train)
    stream = builtin_split(0).train
    drawn = {d.index * 32 for d in draws_between(manifest.seed, range(3), 2, 2, 2, manifest.samples, 0, manifest.samples)}
    holding = [i for i, (s, e, _) in enumerate(docs.entries) if any(s <= t < e for t in drawn)]
    answers = {i: prove_document(tmp_path, stream[s:e], manifest) for i, (s, e, _) in enumerate(docs.entries)
               if i in holding or i < 10}
    assert {i for i, a in answers.items() if a.used} >= set(holding) and any(not a.used for a in answers.values())
    for a in answers.values():
        if a.used:
            assert {d.step for d in a.proof.draws} <= {0, 1, 2} and a.to_json()["draws"] == len(a.proof.draws)
    assert prove_document(tmp_path, b"not a document", manifest).answer == "absent"


def test_a_run_whose_documents_the_corpus_does_not_give_is_refused(tmp_path):
    _, manifest = corpus_run(tmp_path, steps=1)
    fields = {f: getattr(manifest, f) for f in RunManifest.SCHEMA if f != "publisher"}
    lying = run_manifest(Identity(blake2b256(b"tests/liar")), **{**fields, "data": {**manifest.data,
                                                                                  "document_count": 3745}})
    with pytest.raises(SamplesMismatchError):
        prove_document(tmp_path, b"x", lying)
