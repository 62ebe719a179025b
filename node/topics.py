"""The gossip topics a node joins (docs/protocol.md §11): one network-wide topic of signed run
manifests, and per run one topic each for attestations, claims, witness reveals, evaluations, spot checks and
fraud proofs (and references to those over the gossip bound)."""

from __future__ import annotations

from open1b.protocol import PROTOCOL_VERSION

RUNS_TOPIC = f"/open1b/{PROTOCOL_VERSION}/runs"


def attestations_topic(run: bytes) -> str:
    return f"/open1b/{PROTOCOL_VERSION}/run/{run.hex()}/attestations"


def reveals_topic(run: bytes) -> str:
    return f"/open1b/{PROTOCOL_VERSION}/run/{run.hex()}/reveals"


def claims_topic(run: bytes) -> str:
    return f"/open1b/{PROTOCOL_VERSION}/run/{run.hex()}/claims"


def evals_topic(run: bytes) -> str:
    return f"/open1b/{PROTOCOL_VERSION}/run/{run.hex()}/evals"


def spotchecks_topic(run: bytes) -> str:
    return f"/open1b/{PROTOCOL_VERSION}/run/{run.hex()}/spotchecks"


def fraud_proofs_topic(run: bytes) -> str:
    return f"/open1b/{PROTOCOL_VERSION}/run/{run.hex()}/fraudproofs"


def fraud_proof_refs_topic(run: bytes) -> str:
    """References to the run's proofs over the gossip bound (node/fraud_proof_refs.py)."""
    return f"/open1b/{PROTOCOL_VERSION}/run/{run.hex()}/fraudproofrefs"


# A statement kind's topic, for the outbox (node/outbox.py): a new kind of statement is gossiped
# once its topic is named here.
_TOPIC_OF_KIND = {"attestation": attestations_topic, "reveal": reveals_topic, "claim": claims_topic,
                  "eval": evals_topic, "spotcheck": spotchecks_topic,
                  "fraud_proof": fraud_proofs_topic, "fraud_proof_ref": fraud_proof_refs_topic}


def statement_topic(kind: str, run: bytes) -> str:
    """The topic a statement of ``kind`` about ``run`` is gossiped on; KeyError for a kind without one."""
    return _TOPIC_OF_KIND[kind](run)
