""""Did this run train on this document?" for a run directory: the prover side of docs/run-format.md §8.

:func:`prove_document` builds the run's documents from the shipped corpus (and refuses a run whose
committed documents are not what the corpus gives), finds the document, takes its draws from the
run's :class:`.data_index.DrawIndex`, and returns one of the three proofs of
:mod:`open1b.protocol.documents` — after checking it with the protocol's own verifier, so a
wrong answer is never printed.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from open1b.protocol import RunManifest
from open1b.protocol.data_proofs import proof_to_json, verify_data_proof
from open1b.protocol.documents import (
    AbsenceProof, DataCommitments, DataProof, InclusionProof, NeverDrawnProof, ProvenSample, document_digest,
    prove_absent, prove_entry, sample_range,
)
from open1b.protocol.merkle import MerkleTree

from .data import builtin_split
from .data_index import load_or_build
from .documents import KEY_EVAL_DOCUMENTS, Documents
from .errors import RunFormatError, SamplesMismatchError
from .provenance import load_run_samples
from .runfile import read_manifest

INCLUDED, NEVER_DRAWN, ABSENT = "included", "never_drawn", "absent"


@dataclass(frozen=True)
class DocumentAnswer:
    """The verified answer about one document (``digest``, ``size`` bytes) in run ``run``."""

    run: bytes
    digest: bytes
    size: int
    proof: DataProof

    @property
    def answer(self) -> str:
        return {InclusionProof: INCLUDED, NeverDrawnProof: NEVER_DRAWN, AbsenceProof: ABSENT}[type(self.proof)]

    @property
    def used(self) -> bool:
        return isinstance(self.proof, InclusionProof)

    def to_json(self) -> dict:
        draws = self.proof.draws if isinstance(self.proof, InclusionProof) else ()
        return {"run": self.run.hex(), "document": self.digest.hex(), "size": self.size, "answer": self.answer,
                "verified": True, "draws": len(draws), "steps": len({d.step for d in draws}),
                "proof": proof_to_json(self.proof)}  # fmt: skip


@functools.cache
def _documents(held_out: int) -> tuple[Documents, dict[bytes, int], list[bytes]]:
    docs = Documents.of(builtin_split(held_out).train)
    return docs, {d: i for i, (_, _, d) in enumerate(docs.entries)}, docs.sorted_digests


def run_documents(manifest: RunManifest) -> tuple[Documents, dict[bytes, int], list[bytes]]:
    """The run's documents (and a digest → entry lookup, and the sorted digests), rebuilt from the
    shipped corpus; :class:`SamplesMismatchError` unless they are the ones the manifest commits to."""
    held_out = manifest.data.get(KEY_EVAL_DOCUMENTS, 0)
    if type(held_out) is not int:
        raise RunFormatError(f"{KEY_EVAL_DOCUMENTS} must be an integer")
    docs, lookup, ordered = _documents(held_out)
    committed = {k: manifest.data.get(k) for k in docs.data_fields()}
    if committed != docs.data_fields():
        raise SamplesMismatchError("the shipped corpus does not give the documents this run commits to")
    return docs, lookup, ordered


def prove_document(run_dir: Path, document: bytes, manifest: RunManifest | None = None) -> DocumentAnswer:
    """The proof about ``document`` (exact bytes) for the run in ``run_dir``, verified."""
    run_dir = Path(run_dir)
    manifest = manifest or read_manifest(run_dir)
    try:
        commitments = DataCommitments.from_manifest(manifest)
    except ValueError as exc:
        raise RunFormatError(str(exc)) from exc
    docs, lookup, ordered = run_documents(manifest)
    digest = document_digest(document)
    if digest not in lookup:
        proof: DataProof = prove_absent(ordered, digest)
    else:
        entry = prove_entry(docs.entries, lookup[digest])
        held = sample_range(entry.start, entry.end, commitments.sample_len, commitments.samples)
        c = commitments
        index = load_or_build(run_dir, manifest.run_id, c.seed, c.steps, (c.ranks, c.micro_batches,
                              c.micro_batch_size), c.samples)  # fmt: skip
        draws = index.draws(held.start, held.stop) if held else []
        if not draws:
            proof = NeverDrawnProof(entry)
        else:
            dataset = load_run_samples(run_dir, manifest)
            tree = MerkleTree(dataset.digests)
            used = sorted({d.index for d in draws})
            proof = InclusionProof(entry, tuple(
                ProvenSample(i, dataset.samples[i].tobytes(), tuple(tree.proof(i))) for i in used), tuple(draws))
    checked = verify_data_proof(commitments, document, proof)
    if not checked.holds:  # the index, the samples or the corpus is not what the manifest commits to
        raise SamplesMismatchError(f"the proof built for this document fails ({checked.code}: {checked.reason})")
    return DocumentAnswer(manifest.run_id, digest, len(document), proof)
