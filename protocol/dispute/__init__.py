"""Disputes: the op trace of a step, fraud proofs and the referee (docs/protocol.md §18).

* :mod:`.trace` — op records, the trace tree and the signed :class:`TraceCommitment`;
* :mod:`.ops` — the op kinds a proof can name and which input rows an output row reads;
* :mod:`.proof` — the :class:`FraudProof` object (canonical CBOR) and :func:`make_fraud_proof`;
* :mod:`.referee` — :func:`verify_fraud_proof` → :class:`FraudVerdict`;
* :mod:`.float32`, :mod:`.reference` — the numpy re-execution, bit-exact with the kernels.

Importing this package loads no numpy; judging a proof that reaches the re-execution does
(the ``referee`` extra).
"""

from .proof import MAX_FRAUD_PROOF_SIZE, FraudProof, make_fraud_proof
from .referee import FraudVerdict, verify_fraud_proof
from .trace import TRACE_CHUNK_SIZE, TraceCommitment

__all__ = ["FraudProof", "FraudVerdict", "MAX_FRAUD_PROOF_SIZE", "TRACE_CHUNK_SIZE", "TraceCommitment",
           "make_fraud_proof", "verify_fraud_proof"]
