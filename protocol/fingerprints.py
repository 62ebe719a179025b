"""A run's committed step fingerprints (docs/run-format.md §10.1): the file, its two commitments
in the manifest's ``data`` map, and the checks a reader makes before using a byte of it.

``RUN/fingerprints.cbor`` is the canonical CBOR list of the S fingerprint maps, in step order.
The manifest commits to it twice, for two readers:

* ``fingerprints_root``: the Merkle root over F_0 … F_{S−1} (F_k = B2 of the canonical CBOR of
  map k), so that one step's F_k can be proven alone (what a ``spotcheck`` names);
* ``fingerprints_blob``: B2 of the file's bytes, its blob address (docs/run-format.md §6.1), so
  that it is fetched and cached like every other blob of the run.

Both are lowercase hex text, present together or not at all (the manifest rule ``fingerprints``,
docs/protocol.md §7). Pure: no numpy; the engine's :mod:`open1b.deterministic.fingerprint`
builds the maps, this module only frames and checks them.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from .codec import decode, encode
from .errors import DecodeError, WrongTypeError
from .hashing import DIGEST_SIZE, blake2b256
from .merkle import merkle_root

FINGERPRINTS_FILE = "fingerprints.cbor"
KEY_ROOT, KEY_BLOB = "fingerprints_root", "fingerprints_blob"
FIELDS = ("step", "losses", "loss", "grad_norm", "clip_coef")
_MAP_BYTES, _SLOT_BYTES, _LIST_BYTES = 96, 5, 16  # bounds on one map's encoding without and per slot (a uint32), the list head


class FingerprintsError(DecodeError):
    """A fingerprints file (or one entry) that is malformed, oversized or not what the run commits to."""

    code = "fingerprints"


def max_fingerprints_size(steps: int, slots: int) -> int:
    """The largest fingerprints file of a run of ``steps`` steps and ``slots`` = ranks × micro_batches."""
    return _LIST_BYTES + steps * (_MAP_BYTES + _SLOT_BYTES * slots)


def commitment(value: Mapping[str, Any]) -> bytes:
    """F_k of one fingerprint map."""
    return blake2b256(encode(dict(value)))


def fingerprints_root(commitments: Sequence[bytes]) -> bytes:
    return merkle_root(list(commitments))


def data_fields(file_bytes: bytes, commitments: Sequence[bytes]) -> dict[str, str]:
    """The two ``data`` keys that commit to a fingerprints file and its entries."""
    return {KEY_ROOT: fingerprints_root(commitments).hex(), KEY_BLOB: blake2b256(file_bytes).hex()}


def committed(data: Mapping[str, Any]) -> tuple[bytes, bytes] | None:
    """``(root, blob address)`` the manifest's ``data`` commits to, None when it commits to no
    fingerprints; :class:`WrongTypeError` (code ``fingerprints``) when the keys are malformed."""
    present = [k for k in (KEY_ROOT, KEY_BLOB) if k in data]
    if not present:
        return None
    if len(present) != 2:
        raise WrongTypeError(f"manifest: {KEY_ROOT} and {KEY_BLOB} come together", code="fingerprints")
    out = []
    for key in (KEY_ROOT, KEY_BLOB):
        text = data[key]
        if type(text) is not str or len(text) != 2 * DIGEST_SIZE or any(c not in "0123456789abcdef" for c in text):
            raise WrongTypeError(f"manifest: {key} is not 64 lowercase hex digits", code="fingerprints")
        out.append(bytes.fromhex(text))
    return out[0], out[1]


def _check_entry(value: Any, step: int, slots: int) -> dict:
    if type(value) is not dict or set(value) != set(FIELDS):
        raise FingerprintsError(f"fingerprint {step}: not a map of exactly {', '.join(FIELDS)}")
    losses = value["losses"]
    if value["step"] != step or type(value["step"]) is not int:
        raise FingerprintsError(f"fingerprint {step}: names step {value['step']!r}")
    if type(losses) is not list or len(losses) != slots:
        raise FingerprintsError(f"fingerprint {step}: not one loss per slot ({slots})")
    bits = [*losses, value["loss"], value["grad_norm"], value["clip_coef"]]
    if any(type(b) is not int or not 0 <= b < 1 << 32 for b in bits):
        raise FingerprintsError(f"fingerprint {step}: a loss or scalar is not float32 bits")
    return value


def decode_fingerprints(file_bytes: bytes, *, steps: int, slots: int, root: bytes) -> list[dict]:
    """The S fingerprint maps of a fingerprints file, checked: its size against
    :func:`max_fingerprints_size` before decoding, canonical CBOR, one well-formed map per step
    in step order, and the Merkle root of their commitments equal to ``root``. Raises
    :class:`FingerprintsError` (or the codec's :class:`DecodeError`) otherwise."""
    if steps < 1 or slots < 1:
        raise FingerprintsError("a run has at least one step and one slot")
    value = decode(file_bytes, max_size=max_fingerprints_size(steps, slots))
    if type(value) is not list or len(value) != steps:
        raise FingerprintsError(f"not a list of {steps} fingerprints")
    entries = [_check_entry(v, k, slots) for k, v in enumerate(value)]
    if fingerprints_root([commitment(e) for e in entries]) != root:
        raise FingerprintsError("the fingerprints do not have the run's fingerprints_root")
    return entries
