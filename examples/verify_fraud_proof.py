"""Judge a fraud proof (docs/protocol.md §18) with nothing but the base install of open1b (cbor2
and pynacl), numpy and blake3 (`pip install 'open1b[referee]'`):

    python examples/verify_fraud_proof.py PROOF [--json]

PROOF is the file holding the encoded proof. Prints the verdict: the op it names and the guilty
party's peer ID. Exit status 0 if the proof convicts someone, 2 if it is refused (with the rule's
reason code), 3 if this referee cannot judge it (an op kind it does not re-execute).
"""
import json
import sys

from open1b.protocol.dispute import MAX_FRAUD_PROOF_SIZE, verify_fraud_proof

with open(sys.argv[1], "rb") as f:
    verdict = verify_fraud_proof(f.read(MAX_FRAUD_PROOF_SIZE + 1))  # one byte over the bound is refused
if "--json" in sys.argv[2:]:
    print(json.dumps(verdict.to_json()))
elif verdict.accepted:
    print(f"step {verdict.step}, op {verdict.position} ({verdict.op}): guilty {', '.join(verdict.guilty_peers)}")
else:
    print(f"{verdict.outcome.value}: {verdict.code} ({verdict.reason})")
sys.exit({"accept": 0, "reject": 2, "ignore": 3}[verdict.outcome.value])
