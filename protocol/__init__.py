"""open1b.protocol — the embeddable, pure protocol library (needs only cbor2 and pynacl).

The names in ``__all__`` are the stable embedding API (docs/protocol.md, "Embedding API"): they
keep their meaning within a protocol version, and anything else may change. How they fit:

* bytes: :func:`encode` / :func:`decode` (canonical CBOR, strictly decoded);
* keys: :class:`Identity` (an Ed25519 seed, also a libp2p peer ID), :func:`sign` / :func:`verify`
  (domain-separated signatures);
* statements: :class:`RunManifest`, :class:`ExternalRunManifest`, :class:`Claim`,
  :class:`Attestation`, :class:`WitnessReveal`, :class:`EvalStatement`, :class:`SpotCheck` — ``X.decode(data)``
  authenticates, ``X.create(identity, ...)`` signs;
  :func:`decode_message` takes any kind;
* judging: :func:`validate_attestation`, :func:`validate_claim`, :func:`validate_reveal`,
  :func:`validate_sync_frame`, :func:`validate_manifest`, :func:`validate_eval`, :func:`validate_spotcheck` give a
  :class:`Verdict` (accept / reject / ignore, with a reason code); :func:`coverage` gives
  per-step status from a set of statements under a :class:`TrustPolicy`, :func:`spot_coverage` the
  spot-check status and :func:`escape_probability` of a forged run escaping, :func:`evaluations`
  the status of a run's evaluations and :func:`leaderboard` the ranked runs; :func:`select_claim`
  arbitrates DHT claim records;
* disputes: :func:`verify_fraud_proof` judges a fraud proof (:mod:`.dispute`: the op trace, the
  proof object and the referee, which re-executes one op with numpy, the ``referee`` extra);
* data: :class:`DataCommitments` (from a manifest) and :func:`verify_data_proof` check that a run
  trained on a document, that it is not in the corpus, or that no step drew it (the three proofs
  of :mod:`.documents`); :func:`proof_from_json` reads the JSON the ``data`` command prints;
* commitments: :func:`state_hash` and friends (a tree: :func:`tensor_proof` proves one tensor),
  Merkle proofs, external trajectories (:func:`resolve_external_run`); Open-1B's v3 hash is the
  module :mod:`.gensyn_handoff`;
* errors: everything raised on purpose is an :class:`Open1bError`; a :class:`ProtocolError`
  carries its ``outcome`` and ``code``.
"""

from . import codec, signing
from .claims import (
    LEASE_ROUND_SECONDS, MAX_LEASE_SECONDS, claim_key, claim_precedence, is_live, select_claim, select_claim_record,
    validate_claim_record,
)
from .codec import decode, encode
from .chain_inputs import batch_digest, genesis
from .commitments import (
    CHUNK_SIZE, ZERO_HASH, TensorBytes, TensorProof, state_hash, tensor_digest, tensor_proof, verify_tensor_proof,
)
from .convictions import Conviction
from .coverage import Contradiction, Coverage, StepCoverage, StepStatus, TrustPolicy, coverage
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
from .data_proofs import proof_from_json, verify_data_proof
from .dispute import FraudVerdict, verify_fraud_proof
from .documents import DataCommitments, document_digest
from .evaluation import MAX_EVAL_SIZE, EvalStatement, evaluations
from .escape import escape_probability
from .hashing import blake2b256
from .leaderboard import leaderboard
from .identity import Identity, peer_id_from_public_key, public_key_from_peer_id
from .merkle import merkle_proof, merkle_root, verify_merkle_proof
from .messages import (
    DEVICE_CLASS, MATCH, MAX_ATTESTATION_SIZE, MAX_CLAIM_SIZE, MAX_MANIFEST_SIZE, MISMATCH, PROTOCOL_VERSION, RUN_FORMAT,
    Attestation, Claim, RunManifest, SignedMessage,
)
from .signing import sign, signing_bytes, verify
from .spotcheck import (
    MAX_SPOTCHECK_SIZE, SpotCheck, SpotCoverage, SpotStatus, StepSpotCoverage, challenge_signature, derive_chunks,
    derive_slot, slot_signature, spot_coverage,
)
from .trajectory import ExternalRun, ExternalRunManifest, parse_state_hash_log, resolve_external_run
from .witness import MAX_REVEAL_SIZE, WitnessReveal, witness_binding, witness_commitment
from .validation import (
    MAX_CLOCK_SKEW_SECONDS, Run, Verdict, decode_message, validate_attestation, validate_claim, validate_eval,
    validate_manifest, validate_reveal, validate_spotcheck, validate_sync_frame,
)

__all__ = [
    # codec and keys
    "encode", "decode", "Identity", "peer_id_from_public_key", "public_key_from_peer_id", "sign", "verify",
    "signing_bytes", "blake2b256",
    # statements
    "PROTOCOL_VERSION", "RUN_FORMAT", "SignedMessage", "RunManifest", "ExternalRunManifest", "Claim", "Attestation", "MATCH",
    "MISMATCH", "WitnessReveal", "EvalStatement", "MAX_EVAL_SIZE", "SpotCheck", "MAX_SPOTCHECK_SIZE", "decode_message", "MAX_MANIFEST_SIZE", "MAX_CLAIM_SIZE", "MAX_ATTESTATION_SIZE",
    "MAX_REVEAL_SIZE", "DEVICE_CLASS",
    # judging
    "Outcome", "Verdict", "Run", "validate_attestation", "validate_claim", "validate_manifest", "validate_reveal",
    "validate_sync_frame", "validate_eval", "evaluations", "leaderboard", "validate_spotcheck", "spot_coverage",
    "SpotCoverage", "StepSpotCoverage", "SpotStatus", "challenge_signature", "derive_chunks", "derive_slot", "slot_signature",
    "escape_probability", "verify_fraud_proof", "FraudVerdict",
    "MAX_CLOCK_SKEW_SECONDS", "coverage", "Coverage", "StepCoverage", "StepStatus", "TrustPolicy", "Contradiction", "Conviction",
    "claim_key", "claim_precedence", "select_claim", "select_claim_record", "validate_claim_record", "is_live", "LEASE_ROUND_SECONDS", "MAX_LEASE_SECONDS",
    # commitments
    "TensorBytes", "ZERO_HASH", "tensor_digest", "state_hash", "genesis", "batch_digest", "CHUNK_SIZE", "TensorProof",
    "tensor_proof", "verify_tensor_proof",
    "merkle_root", "merkle_proof", "verify_merkle_proof",
    "ExternalRun", "parse_state_hash_log", "resolve_external_run", "witness_commitment", "witness_binding",
    # data proofs
    "DataCommitments", "document_digest", "verify_data_proof", "proof_from_json",
    # errors
    "Open1bError", "ProtocolError", "DecodeError", "OversizeError", "NonCanonicalError", "SchemaError",
    "UnknownFieldError", "MissingFieldError", "WrongTypeError", "SignatureError", "InvalidStatementError",
    "UnjudgeableError",
]
