"""Documents, their commitments and the data proofs (docs/run-format.md §8): "did this run train
on this document?". Checking a proof is :mod:`.data_proofs`.

A run's training stream is cut into **documents** (byte ranges, in order) as well as into samples.
The manifest's ``data`` map commits to both views of the documents:

* ``documents_root`` = MTH over entries ``u64le(start) ‖ u64le(end) ‖ document_digest(bytes)``
  in stream order: which tokens each document is, hence which samples hold it;
* ``document_set_root`` = MTH over the same digests sorted bytewise (the trainer refuses two equal
  documents, so they are strictly increasing): a digest that is *not* there has a proof, its two
  neighbours.

Three answers follow, each checked (:mod:`.data_proofs`) against those commitments and the run's
public draw rule (:mod:`.data_order`) alone — no engine, no numpy:

* :class:`InclusionProof` — the document is entry i, and these (step, rank, micro-batch, row)
  drew these samples, which hold its bytes;
* :class:`AbsenceProof` — the document is not in the corpus (the sorted neighbours);
* :class:`NeverDrawnProof` — it is entry i, and re-deriving every draw of steps [0, S) finds none
  in its sample range.

The proofs are about exact bytes (``bytes/v1``: token i is byte i): a document that differs by one
byte, a substring or a near-duplicate is another document, about which these proofs say nothing.
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass
from typing import Any, Sequence

from .data_order import Draw
from .hashing import DIGEST_SIZE, blake2b256
from .merkle import merkle_proof, merkle_root

DOCUMENT_TAG = b"open1b/document/v1\x00"
SAMPLE_TAG = b"open1b/sample/v1\x00"
_ENTRY = struct.Struct("<QQ")

# The data-map keys (docs/run-format.md §8.2); hashes are lowercase hex texts, since the map holds scalars.
KEY_RULE, KEY_COUNT, KEY_ROOT, KEY_SET_ROOT = "documents", "document_count", "documents_root", "document_set_root"


def document_digest(document: bytes) -> bytes:
    """d = B2("open1b/document/v1\\0" ‖ the document's bytes), no normalisation of any kind."""
    return blake2b256(DOCUMENT_TAG, document)


def sample_digest(tokens: bytes, width: int = 1) -> bytes:
    """s_i = B2("open1b/sample/v1\\0" ‖ u8(w) ‖ the sample's token bytes) (docs/run-format.md §4.3)."""
    return blake2b256(SAMPLE_TAG, bytes([width]), tokens)


def entry_value(start: int, end: int, digest: bytes) -> bytes:
    """Leaf value of the documents tree: the token range [start, end) and the digest."""
    return _ENTRY.pack(start, end) + digest


def documents_root(entries: Sequence[tuple[int, int, bytes]]) -> bytes:
    return merkle_root([entry_value(*e) for e in entries])


def document_set_root(digests: Sequence[bytes]) -> bytes:
    """Root of the sorted set; :class:`ValueError` if two documents are equal (no absence proof
    could then be unique, and an exclusion by draw would have to show every copy)."""
    ordered = sorted(digests)
    if any(a == b for a, b in zip(ordered, ordered[1:])):
        raise ValueError("two documents have the same bytes; a run's documents must be distinct")
    return merkle_root(ordered)


def sample_range(start: int, end: int, sample_len: int, samples: int) -> range:
    """The samples that hold at least one token of [start, end): sample i holds tokens
    [i(L−1), i(L−1) + L), so i runs from ⌈(start − L + 1) / (L − 1)⌉ to ⌊(end − 1) / (L − 1)⌋,
    clipped to [0, N). Empty for an empty document or one past the last sample."""
    stride = sample_len - 1
    if end <= start:
        return range(0)
    first = max(0, -(-(start - stride) // stride))
    return range(first, min(samples, (end - 1) // stride + 1))


@dataclass(frozen=True)
class DataCommitments:
    """What a data proof is checked against: the run's draw rule parameters, its samples
    commitment and its two document commitments (from a signed manifest, :meth:`from_manifest`)."""

    seed: int
    steps: int
    ranks: int
    micro_batches: int
    micro_batch_size: int
    sample_len: int
    samples: int
    samples_root: bytes
    document_count: int
    documents_root: bytes
    document_set_root: bytes

    @classmethod
    def from_manifest(cls, manifest: Any) -> DataCommitments:
        """From a :class:`~.messages.RunManifest`; :class:`ValueError` if it commits to no
        documents or its data order is not ``open1b/data/v2`` with ``bytes/v1``."""
        data, model = manifest.data, manifest.model
        if data.get("order") != "open1b/data/v2" or data.get("tokenizer") != "bytes/v1":
            raise ValueError("data proofs are defined for order open1b/data/v2 with tokenizer bytes/v1")
        try:
            return cls(manifest.seed, manifest.steps, model["ranks"], model["micro_batches"],
                       model["micro_batch_size"], model["seq_len"] + 1, manifest.samples, manifest.samples_root,
                       data[KEY_COUNT], hex_hash(data[KEY_ROOT]), hex_hash(data[KEY_SET_ROOT]))  # fmt: skip
        except (KeyError, TypeError) as exc:
            raise ValueError(f"the run commits to no documents ({exc})") from exc

    def __post_init__(self) -> None:
        ints = (self.seed, self.steps, self.ranks, self.micro_batches, self.micro_batch_size, self.sample_len,
                self.samples, self.document_count)
        if any(type(v) is not int for v in ints) or self.sample_len < 2 or self.samples < 1 \
                or self.document_count < 1 or min(ints) < 0:
            raise ValueError("data commitments out of range")
        if any(len(h) != DIGEST_SIZE for h in (self.samples_root, self.documents_root, self.document_set_root)):
            raise ValueError("data commitments hold 32-byte roots")


def hex_hash(text: Any) -> bytes:
    """A 32-byte hash written as 64 lowercase hex digits (the data map's and the JSON's form)."""
    if type(text) is not str or len(text) != 2 * DIGEST_SIZE or text != text.lower():
        raise TypeError(f"{text!r} is not a lowercase hex hash")
    return bytes.fromhex(text)


# -- proofs ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DocumentEntry:
    """Entry ``index`` of the documents tree: tokens [start, end), with its audit path."""

    index: int
    start: int
    end: int
    path: tuple[bytes, ...]


@dataclass(frozen=True)
class SetNeighbour:
    """Leaf ``index`` of the sorted document set holds ``digest`` (audit path ``path``)."""

    digest: bytes
    index: int
    path: tuple[bytes, ...]


@dataclass(frozen=True)
class ProvenSample:
    """Sample ``index`` holds ``tokens`` (its audit path against ``samples_root``)."""

    index: int
    tokens: bytes
    path: tuple[bytes, ...]


@dataclass(frozen=True)
class InclusionProof:
    """The document is ``entry``; every draw in ``draws`` took one of ``samples``."""

    entry: DocumentEntry
    samples: tuple[ProvenSample, ...]
    draws: tuple[Draw, ...]


@dataclass(frozen=True)
class AbsenceProof:
    """The document's digest lies strictly between two adjacent leaves of the sorted set (or
    before the first, or after the last: then one side is ``None``)."""

    lower: SetNeighbour | None
    upper: SetNeighbour | None


@dataclass(frozen=True)
class NeverDrawnProof:
    """The document is ``entry``; the verifier re-derives the draws (nothing else to carry)."""

    entry: DocumentEntry


DataProof = InclusionProof | AbsenceProof | NeverDrawnProof


# -- proving (from the full lists; deterministic/document_proofs.py calls these) ------------------
def prove_entry(entries: Sequence[tuple[int, int, bytes]], index: int) -> DocumentEntry:
    start, end, _ = entries[index]
    return DocumentEntry(index, start, end, tuple(merkle_proof([entry_value(*e) for e in entries], index)))


def prove_absent(sorted_digests: Sequence[bytes], digest: bytes) -> AbsenceProof:
    """The neighbours of ``digest`` in the sorted set; :class:`ValueError` if it is there."""
    i = bisect.bisect_left(sorted_digests, digest)
    if i < len(sorted_digests) and sorted_digests[i] == digest:
        raise ValueError("the document is in the corpus")

    def side(j: int) -> SetNeighbour | None:
        if not 0 <= j < len(sorted_digests):
            return None
        return SetNeighbour(sorted_digests[j], j, tuple(merkle_proof(sorted_digests, j)))

    return AbsenceProof(side(i - 1), side(i))


