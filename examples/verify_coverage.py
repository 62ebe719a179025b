"""Check a run's coverage from its manifest and a file of attestations (one hex-encoded per line),
with nothing but the base install of open1b (cbor2 and pynacl):

    python examples/verify_coverage.py run/manifest.cbor attestations.hex [REDUNDANCY]

Exit status 0: every step has REDUNDANCY distinct attesters and none is disputed; 2 otherwise.
"""
import sys

from open1b.protocol import Attestation, Open1bError, RunManifest, coverage

manifest = RunManifest.decode(open(sys.argv[1], "rb").read())  # verifies the publisher's signature
attestations = []
for number, line in enumerate(open(sys.argv[2]), 1):
    try:
        attestations.append(Attestation.decode(bytes.fromhex(line)))  # verifies the signer's signature
    except (Open1bError, ValueError) as exc:
        print(f"line {number} skipped: {exc}")
cov = coverage(manifest, attestations, redundancy=int(sys.argv[3]) if len(sys.argv) > 3 else 1)
for s in cov.steps:
    print(f"step {s.step}: {s.status.value}, {len(s.auditors)} match, {len(s.dissenters)} mismatch")
print(f"{cov.count('verified')}/{len(cov.steps)} verified, disputed {cov.disputed_steps}, complete {cov.complete}")
sys.exit(0 if cov.complete and not cov.disputed_steps else 2)
