"""Checking data proofs (docs/run-format.md §8.5) and their JSON form (§8.4): pure functions of
a proof, the document's bytes and the run's :class:`~.documents.DataCommitments`.

Every rule is a ``# [FAIL]`` comment above its check, with the reason code a failed
:class:`ProofCheck` carries; a proof is untrusted input, so a malformed one fails (``malformed``)
rather than raising.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .data_order import Draw, draws_between, sample_index
from .documents import (
    AbsenceProof, DataCommitments, DataProof, DocumentEntry, InclusionProof, NeverDrawnProof, ProvenSample,
    SetNeighbour, document_digest, entry_value, hex_hash, sample_digest, sample_range,
)
from .hashing import DIGEST_SIZE
from .merkle import verify_merkle_proof

MAX_PROOF_JSON = 1 << 24
"""Bound on a data proof's JSON text (16 MiB), checked before it is parsed."""


@dataclass(frozen=True)
class ProofCheck:
    """A verifier's answer: ``holds``, or the first rule that failed (``code``, docs/run-format.md §8.5)."""

    holds: bool
    code: str = "ok"
    reason: str = ""


_OK = ProofCheck(True)


def _fail(code: str, reason: str) -> ProofCheck:
    return ProofCheck(False, code, reason)


def _check_entry(c: DataCommitments, digest: bytes, entry: DocumentEntry, size: int) -> ProofCheck:
    # [FAIL] the entry is not leaf `index` of the documents tree with this digest and range
    if not (type(entry.start) is int and type(entry.end) is int and 0 <= entry.start < entry.end < 1 << 64
            and entry.end - entry.start == size and type(entry.index) is int):
        return _fail("entry", "the entry's range is not the document's length")
    if not verify_merkle_proof(entry_value(entry.start, entry.end, digest), entry.index, c.document_count,
                               entry.path, c.documents_root):
        return _fail("entry", "the entry does not verify against documents_root")
    return _OK


def _expected_draws(c: DataCommitments, entry: DocumentEntry) -> list[Draw]:
    held = sample_range(entry.start, entry.end, c.sample_len, c.samples)
    if not held:
        return []
    return draws_between(c.seed, range(c.steps), c.ranks, c.micro_batches, c.micro_batch_size, c.samples,
                         held.start, held.stop)


def verify_inclusion(c: DataCommitments, document: bytes, proof: InclusionProof, *,
                     complete: bool = True) -> ProofCheck:
    """Check that the run trained on ``document`` exactly as ``proof`` says.

    Each listed draw is checked by recomputing its one hash; ``complete`` (the default) also
    re-derives every draw of the run to check that the list misses none (the cost of
    :func:`~.data_order.draws_between`)."""
    try:
        return _verify_inclusion(c, document, proof, complete)
    except (TypeError, ValueError, AttributeError) as exc:  # a proof is untrusted input
        return _fail("malformed", str(exc))


def _verify_inclusion(c: DataCommitments, document: bytes, proof: InclusionProof, complete: bool) -> ProofCheck:
    entry = proof.entry
    checked = _check_entry(c, document_digest(document), entry, len(document))
    if not checked.holds:
        return checked
    held, stride = sample_range(entry.start, entry.end, c.sample_len, c.samples), c.sample_len - 1
    tokens: dict[int, bytes] = {}
    for s in proof.samples:
        # [FAIL] a sample outside the document's range, proven twice, or not under samples_root
        if type(s.index) is not int or s.index not in held or s.index in tokens:
            return _fail("sample", f"sample {s.index} does not hold the document, or is listed twice")
        if len(s.tokens) != c.sample_len or not verify_merkle_proof(
                sample_digest(s.tokens), s.index, c.samples, s.path, c.samples_root):
            return _fail("sample", f"sample {s.index} does not verify against samples_root")
        # [FAIL] the sample's tokens inside the document's range are not the document's bytes
        lo, hi = max(entry.start, s.index * stride), min(entry.end, s.index * stride + c.sample_len)
        if s.tokens[lo - s.index * stride:hi - s.index * stride] != document[lo - entry.start:hi - entry.start]:
            return _fail("sample", f"sample {s.index} does not hold the document's bytes")
        tokens[s.index] = s.tokens
    for d in proof.draws:
        # [FAIL] a draw outside the run, of a sample not proven, or not what the draw rule gives
        if not (type(d.step) is int and 0 <= d.step < c.steps and type(d.rank) is int and 0 <= d.rank < c.ranks
                and type(d.micro_batch) is int and 0 <= d.micro_batch < c.micro_batches
                and type(d.row) is int and 0 <= d.row < c.micro_batch_size):
            return _fail("draw", f"draw {d} is outside the run's steps or topology")
        if d.index not in tokens:
            return _fail("draw", f"draw {d} takes a sample the proof does not prove")
        if sample_index(c.seed, d.step, d.rank, d.micro_batch, d.row, c.samples) != d.index:
            return _fail("draw", f"the draw rule does not give sample {d.index} at {d}")
    # [FAIL] (complete) the draws are not every draw of the document's samples, in order
    if not proof.draws:
        return _fail("draw", "an inclusion proof lists at least one draw; none is a never-drawn proof")
    if complete and list(proof.draws) != _expected_draws(c, entry):
        return _fail("incomplete", "the draws listed are not every draw of the document's samples")
    return _OK


def verify_never_drawn(c: DataCommitments, document: bytes, proof: NeverDrawnProof) -> ProofCheck:
    """Check that ``document`` is in the corpus and that no step in [0, S) drew any of its
    samples: one hash per row of every step (:func:`~.data_order.draws_between`)."""
    try:
        checked = _check_entry(c, document_digest(document), proof.entry, len(document))
        if not checked.holds:
            return checked
        # [FAIL] re-deriving the draws finds one in the document's sample range
        hits = _expected_draws(c, proof.entry)
        if hits:
            return _fail("drawn", f"step {hits[0].step} drew sample {hits[0].index}, which holds the document")
        return _OK
    except (TypeError, ValueError, AttributeError) as exc:
        return _fail("malformed", str(exc))


def verify_absent(c: DataCommitments, document: bytes, proof: AbsenceProof) -> ProofCheck:
    """Check that no document of the corpus has ``document``'s digest: its neighbours in the
    sorted set are adjacent leaves and bracket it strictly."""
    try:
        return _verify_absent(c, document_digest(document), proof)
    except (TypeError, ValueError, AttributeError) as exc:
        return _fail("malformed", str(exc))


def _verify_absent(c: DataCommitments, digest: bytes, proof: AbsenceProof) -> ProofCheck:
    lower, upper, n = proof.lower, proof.upper, c.document_count
    # [FAIL] no neighbour at all
    if lower is None and upper is None:
        return _fail("neighbours", "an absence proof names at least one neighbour")
    for side in (lower, upper):
        # [FAIL] a neighbour is not a leaf of the sorted set
        if side is not None and not (len(side.digest) == DIGEST_SIZE and verify_merkle_proof(
                side.digest, side.index, n, side.path, c.document_set_root)):
            return _fail("neighbours", "a neighbour does not verify against document_set_root")
    # [FAIL] the neighbours do not bracket the digest strictly
    if (lower is not None and not lower.digest < digest) or (upper is not None and not digest < upper.digest):
        return _fail("order", "the document's digest is not strictly between its neighbours")
    # [FAIL] the neighbours are not adjacent (or the one side given is not the first / last leaf)
    adjacent = (upper.index == lower.index + 1 if lower is not None and upper is not None
                else upper.index == 0 if upper is not None else lower.index == n - 1)  # fmt: skip
    if not adjacent:
        return _fail("adjacent", "the neighbours are not adjacent leaves of the sorted set")
    return _OK


def verify_data_proof(c: DataCommitments, document: bytes, proof: DataProof) -> ProofCheck:
    """Any of the three proofs, by its type."""
    if isinstance(proof, InclusionProof):
        return verify_inclusion(c, document, proof)
    if isinstance(proof, NeverDrawnProof):
        return verify_never_drawn(c, document, proof)
    if isinstance(proof, AbsenceProof):
        return verify_absent(c, document, proof)
    return _fail("malformed", f"{type(proof).__name__} is not a data proof")


# -- JSON (what the data command prints and a verifier reads) -----------------------------------
def proof_to_json(proof: DataProof) -> dict:
    def hexes(path: Sequence[bytes]) -> list[str]:
        return [p.hex() for p in path]

    def entry(e: DocumentEntry) -> dict:
        return {"index": e.index, "start": e.start, "end": e.end, "path": hexes(e.path)}

    def neighbour(s: SetNeighbour | None) -> dict | None:
        return None if s is None else {"digest": s.digest.hex(), "index": s.index, "path": hexes(s.path)}

    if isinstance(proof, InclusionProof):
        return {"kind": "included", "entry": entry(proof.entry),
                "samples": [{"index": s.index, "tokens": s.tokens.hex(), "path": hexes(s.path)} for s in proof.samples],
                "draws": [[d.step, d.rank, d.micro_batch, d.row, d.index] for d in proof.draws]}  # fmt: skip
    if isinstance(proof, NeverDrawnProof):
        return {"kind": "never_drawn", "entry": entry(proof.entry)}
    return {"kind": "absent", "lower": neighbour(proof.lower), "upper": neighbour(proof.upper)}


def proof_from_json(value: Mapping[str, Any]) -> DataProof:
    """The proof a JSON object describes; :class:`ValueError` on any malformed field (its
    contents are checked by the ``verify_*`` functions, not here)."""
    try:
        kind = value["kind"]
        if kind == "included":
            return InclusionProof(_entry(value["entry"]), tuple(
                ProvenSample(_int(s["index"]), _hex(s["tokens"]), _path(s["path"])) for s in value["samples"]),
                tuple(Draw(*map(_int, d)) for d in value["draws"]))  # fmt: skip
        if kind == "never_drawn":
            return NeverDrawnProof(_entry(value["entry"]))
        if kind == "absent":
            return AbsenceProof(_neighbour(value["lower"]), _neighbour(value["upper"]))
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"malformed data proof: {exc!r}") from exc
    raise ValueError(f"unknown data proof kind {kind!r}")


def _int(v: Any) -> int:
    if type(v) is not int:
        raise TypeError(f"{v!r} is not an integer")
    return v


def _hex(v: Any) -> bytes:
    """Lowercase hex without separators (bytes.fromhex alone would take upper case and spaces)."""
    if type(v) is not str or not set(v) <= set("0123456789abcdef"):
        raise TypeError(f"{v!r} is not lowercase hex")
    return bytes.fromhex(v)


def _path(v: Any) -> tuple[bytes, ...]:
    if type(v) is not list:
        raise TypeError("a path is a list of hex hashes")
    return tuple(hex_hash(h) for h in v)


def _entry(v: Mapping[str, Any]) -> DocumentEntry:
    return DocumentEntry(_int(v["index"]), _int(v["start"]), _int(v["end"]), _path(v["path"]))


def _neighbour(v: Mapping[str, Any] | None) -> SetNeighbour | None:
    return None if v is None else SetNeighbour(hex_hash(v["digest"]), _int(v["index"]), _path(v["path"]))
