"""Runs whose state hashes live outside the manifest: an external trajectory, e.g. the
``state_hashes.jsonl`` log that Gensyn's Open-1B run published.

An :class:`ExternalRunManifest` is a signed manifest that commits to a trajectory file by its
BLAKE2b-256 digest and size, names the window of it that the run covers (``first_step`` and
``steps``, in the file's own step numbering), and commits to that window's hashes once more as
a Merkle root (:mod:`.merkle`), so a light verifier can check one step's hashes with a proof
instead of the whole file. :func:`resolve_external_run` checks a file against a manifest and
returns an :class:`ExternalRun`, which validation and coverage accept wherever they accept a
:class:`~open1b.protocol.messages.RunManifest`: attestation step j of the run replays the
transition from log step ``first_step + j`` to ``first_step + j + 1``.

Trajectory format ``"jsonl"`` (byte-level rules, docs/protocol.md "External trajectories"):
UTF-8; lines end with LF (a CR before it is dropped); lines of spaces, tabs and CRs only are
skipped; every other line is one JSON object without duplicate keys, with ``"step"`` an integer
in [0, 2^64 - 1] written without fraction or exponent and
``"state_hash"`` 64 hex digits (either case); other keys are ignored. If a step appears more
than once, its last line wins (a resumed run re-logs the steps it repeats).
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Sequence

from .errors import InvalidStatementError, WrongTypeError
from .hashing import blake2b256
from .messages import _HASH, _KEY, MAX_MANIFEST_SIZE, SignedMessage
from .merkle import merkle_root, verify_merkle_proof
from .schema import UINT64_MAX, Enum, FieldType, Scalars, Text, UInt

MAX_EXTERNAL_STEPS = 1 << 20
MAX_TRAJECTORY_SIZE = 64 << 20
TRAJECTORY_FORMATS = frozenset({"jsonl"})
_HEX = frozenset(string.hexdigits)
_JSON_WHITESPACE = " \t\r"  # RFC 8259's whitespace within a line; Python's str.strip() knows more


@dataclass(frozen=True)
class ExternalRunManifest(SignedMessage):
    """A publisher's signed pointer to a run whose state-hash chain is an external file."""

    KIND: ClassVar[str] = "external_manifest"
    MAX_SIZE: ClassVar[int] = MAX_MANIFEST_SIZE
    SIGNER: ClassVar[str] = "publisher"
    SCHEMA: ClassVar[Mapping[str, FieldType]] = {
        "engine": Text(max_length=64),
        "engine_version": Text(max_length=64),
        "model": Scalars(max_entries=64),
        "data": Scalars(max_entries=16),
        "steps": UInt(maximum=MAX_EXTERNAL_STEPS),
        "first_step": UInt(),
        "trajectory_format": Enum(TRAJECTORY_FORMATS),
        "trajectory_uri": Text(max_length=256),
        "trajectory_size": UInt(maximum=MAX_TRAJECTORY_SIZE),
        "trajectory_digest": _HASH,
        "trajectory_root": _HASH,
        "publisher": _KEY,
        "created_at": UInt(),
    }

    engine: str
    engine_version: str
    model: dict[str, Any]
    data: dict[str, Any]
    steps: int
    first_step: int
    trajectory_format: str
    trajectory_uri: str
    trajectory_size: int
    trajectory_digest: bytes
    trajectory_root: bytes
    publisher: bytes
    created_at: int

    def _check_semantics(self) -> None:
        if self.steps < 1:
            raise WrongTypeError("external manifest: steps must be at least 1", code="state_hashes")

    @property
    def run_id(self) -> bytes:
        return self.digest

    def __hash__(self) -> int:
        return hash(self.digest)

    def proves(self, index: int, state_hash: bytes, proof: Sequence[bytes]) -> bool:
        """Whether ``state_hash`` is the run's h_index, by a Merkle proof against the root."""
        return verify_merkle_proof(state_hash, index, self.steps + 1, proof, self.trajectory_root)


@dataclass(frozen=True)
class ExternalRun:
    """An external manifest with its trajectory window, checked against every commitment."""

    manifest: ExternalRunManifest
    state_hashes: tuple[bytes, ...]

    @property
    def run_id(self) -> bytes:
        return self.manifest.run_id

    @property
    def steps(self) -> int:
        return self.manifest.steps

    @property
    def engine(self) -> str:
        return self.manifest.engine

    @property
    def engine_version(self) -> str:
        return self.manifest.engine_version

    @property
    def publisher(self) -> bytes:
        return self.manifest.publisher


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("duplicate key")
    return dict(pairs)


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # Python's json accepts NaN and Infinity; RFC 8259 does not


def parse_state_hash_log(data: bytes) -> dict[int, bytes]:
    """``{log step: state hash}`` from a ``jsonl`` trajectory; raises on any malformed line."""
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidStatementError("trajectory is not UTF-8", code="trajectory_format") from exc
    hashes: dict[int, bytes] = {}
    for number, line in enumerate(text.split("\n"), 1):
        line = line.removesuffix("\r")
        if not line.strip(_JSON_WHITESPACE):
            continue
        try:
            row = json.loads(line, object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constants)
            if type(row) is not dict:
                raise ValueError("not a JSON object")
            missing = [key for key in ("step", "state_hash") if key not in row]
            if missing:  # named: a bare KeyError reads as "'state_hash'"
                raise ValueError(f"no {missing[0]}")
            step, digest = row["step"], row["state_hash"]
            if type(step) is not int or not 0 <= step <= UINT64_MAX or type(digest) is not str or len(digest) != 64 \
                    or not set(digest) <= _HEX:
                raise ValueError("bad step or state_hash")
            hashes[step] = bytes.fromhex(digest)
        except (ValueError, TypeError, KeyError, RecursionError) as exc:  # deep nesting: RecursionError
            raise InvalidStatementError(f"trajectory line {number}: {exc}", code="trajectory_format") from exc
    return hashes


def resolve_external_run(manifest: ExternalRunManifest, trajectory: bytes) -> ExternalRun:
    """Check ``trajectory`` against the manifest's size, digest, window and Merkle root."""
    if len(trajectory) != manifest.trajectory_size:
        raise InvalidStatementError("trajectory size differs from the manifest's", code="trajectory_digest")
    if blake2b256(trajectory) != manifest.trajectory_digest:
        raise InvalidStatementError("trajectory digest differs from the manifest's", code="trajectory_digest")
    log = parse_state_hash_log(trajectory)
    window = range(manifest.first_step, manifest.first_step + manifest.steps + 1)
    missing = [s for s in window if s not in log]
    if missing:
        raise InvalidStatementError(f"trajectory lacks log step {missing[0]}", code="trajectory_window")
    hashes = tuple(log[s] for s in window)
    if merkle_root(hashes) != manifest.trajectory_root:
        raise InvalidStatementError("trajectory window's Merkle root differs from the manifest's",
                                    code="trajectory_root")
    return ExternalRun(manifest, hashes)
