"""open1b.protocol — the embeddable, pure protocol library (needs only cbor2 and pynacl).

How the pieces fit:

* :mod:`.codec` — canonical CBOR, strictly decoded;
* :mod:`.identity` / :mod:`.signing` — Ed25519 keys that are also libp2p peer IDs, and
  domain-separated signatures;
* :mod:`.messages` — the signed statements: :class:`RunManifest`, :class:`Claim`,
  :class:`Attestation`;
* :mod:`.commitments` — the chained state hash and batch digests;
* :mod:`.claims` — DHT claim keys and their strict total order;
* :mod:`.validation` — accept / reject / ignore, one rule at a time;
* :mod:`.coverage` — per-step status from a set of statements;
* :mod:`.errors` — the project's error root and the typed protocol errors.
"""

from .claims import claim_key, claim_precedence, is_live, select_claim
from .codec import decode, encode
from .commitments import ZERO_HASH, TensorBytes, batch_digest, genesis, state_hash, tensor_digest
from .coverage import Coverage, StepCoverage, StepStatus, coverage
from .errors import (
    DecodeError,
    InvalidStatementError,
    MissingFieldError,
    NonCanonicalError,
    Open1bError,
    Outcome,
    OversizeError,
    ProtocolError,
    SchemaError,
    SignatureError,
    UnjudgeableError,
    UnknownFieldError,
    WrongTypeError,
)
from .hashing import blake2b256
from .identity import Identity, peer_id_from_public_key, public_key_from_peer_id
from .messages import MATCH, MISMATCH, PROTOCOL_VERSION, Attestation, Claim, RunManifest, SignedMessage
from .validation import Verdict, validate_attestation, validate_claim, validate_manifest

__all__ = [name for name in dir() if not name.startswith("_")]
