"""The documents of the shipped corpus, the held-out evaluation split, and the manifest keys that
commit to both (docs/run-format.md §8).

The split rule ``open1b/documents/headers-v1`` is a function of the bytes alone, so anyone holding
the corpus (or the samples: they are its bytes) re-derives the same documents: a document starts
at byte 0 and at every position p where the two bytes before p are ``\\n\\n`` and the line that
starts at p (up to the next ``\\n``, which must exist) begins with ``== `` and ends with `` ==``
(``== name ==``, the header ``corpus/build.py`` writes); it runs to the next start or to the end.
For the shipped corpus this gives exactly ``build.py``'s 3,746 documents, header and trailing
blank line included.

A run MAY hold out the last H documents as its evaluation set: it then trains on the stream
before the first of them and evaluates on the rest (:class:`CorpusSplit`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from open1b.protocol.documents import (
    KEY_COUNT, KEY_ROOT, KEY_RULE, KEY_SET_ROOT, document_digest, document_set_root, documents_root,
)

DOCUMENTS_RULE = "open1b/documents/headers-v1"
# Zero-width lookbehind: every position after "\n\n" is tried, so two headers can never hide each other.
_HEADER = re.compile(rb"(?<=\n\n)== [^\n]* ==\n")

# Evaluation keys of the manifest's data map (docs/run-format.md §9.1).
KEY_EVAL_DOCUMENTS, KEY_EVAL_SAMPLES, KEY_EVAL_ROOT, KEY_EVAL_EVERY = (
    "eval_documents", "eval_samples", "eval_root", "eval_every")


def document_starts(stream: bytes) -> list[int]:
    """Where each document of ``stream`` starts under ``open1b/documents/headers-v1``."""
    return [0] + [m.start() for m in _HEADER.finditer(stream)] if stream else []


@dataclass(frozen=True)
class Documents:
    """The documents of a training stream: (start, end, digest) in stream order."""

    entries: tuple[tuple[int, int, bytes], ...]

    @classmethod
    def of(cls, stream: bytes) -> Documents:
        starts = document_starts(stream)
        bounds = zip(starts, starts[1:] + [len(stream)])
        return cls(tuple((s, e, document_digest(stream[s:e])) for s, e in bounds))

    @property
    def sorted_digests(self) -> list[bytes]:
        return sorted(d for _, _, d in self.entries)

    def data_fields(self) -> dict[str, int | str]:
        """The manifest ``data`` keys that commit to these documents; :class:`ValueError` if two
        are equal (a run's documents must be distinct)."""
        return {KEY_RULE: DOCUMENTS_RULE, KEY_COUNT: len(self.entries),
                KEY_ROOT: documents_root(self.entries).hex(),
                KEY_SET_ROOT: document_set_root([d for _, _, d in self.entries]).hex()}  # fmt: skip


@dataclass(frozen=True)
class CorpusSplit:
    """A corpus cut at a document boundary: ``train`` is every byte before the last
    ``held_out`` documents, ``evaluation`` the held-out documents' bytes (empty when none)."""

    train: bytes
    evaluation: bytes
    held_out: int

    @classmethod
    def of(cls, corpus: bytes, held_out: int) -> CorpusSplit:
        starts = document_starts(corpus)
        if not 0 <= held_out < len(starts):
            raise ValueError(f"cannot hold out {held_out} of the corpus's {len(starts)} documents")
        cut = len(corpus) if held_out == 0 else starts[-held_out]
        return cls(corpus[:cut], corpus[cut:], held_out)
