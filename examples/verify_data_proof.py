"""Check an answer of `open1b-node data RUN ... --json` (docs/run-format.md §8) with nothing but the
base install of open1b (cbor2 and pynacl):

    python examples/verify_data_proof.py run/manifest.cbor DOCUMENT answer.json

DOCUMENT is the file whose exact bytes the answer is about. Prints what the proof shows; exit
status 0 if it holds, 2 if it fails (with the rule's reason code).
"""
import json
import sys

from open1b.protocol import DataCommitments, RunManifest, proof_from_json, verify_data_proof
from open1b.protocol.data_proofs import MAX_PROOF_JSON

manifest = RunManifest.decode(open(sys.argv[1], "rb").read())  # verifies the publisher's signature
document = open(sys.argv[2], "rb").read()
answer = json.loads(open(sys.argv[3], "rb").read(MAX_PROOF_JSON + 1)[:MAX_PROOF_JSON])  # bounded before parsing
proof = proof_from_json(answer["proof"])
check = verify_data_proof(DataCommitments.from_manifest(manifest), document, proof)
print(f"{answer['proof']['kind']}: {'holds' if check.holds else 'fails: ' + check.code}")
sys.exit(0 if check.holds else 2)
