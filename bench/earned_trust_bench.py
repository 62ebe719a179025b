"""What earned trust costs the daemon (docs/protocol.md §8.1.1), against what it already does.

    PYTHONPATH=.pkg .venv/bin/python bench/earned_trust_bench.py [--runs 4] [--steps 256] [--keys 4] [--repeats 5]

A store with ``runs`` runs (the node publishes the first, others the rest) of ``steps`` steps,
each step matched by the node and ``keys − 1`` other keys with proven bindings, and the node's
own witness of every step. Timed, alternately (a change in the machine's load affects all alike):

* ``coverage`` (the baseline): coverage of every run from the store, as the daemon's judgement
  computes it for each run that received statements;
* ``earned, every run read``: :class:`EarnedTrust` from scratch — its first call at start;
* ``earned, one run read``: one run marked changed, the others cached — a judgement after
  statements arrive on one run.

Ratios are each variant's median time / the baseline's median, measured in the same run.
Writes bench/results/earned_trust.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from open1b.node.earned_trust import EarnedTrust, EarnRule
from open1b.node.store import Store
from open1b.protocol import RUN_FORMAT, Attestation, Identity, RunManifest, TrustPolicy, coverage
from open1b.protocol.coverage import ALLOWLIST
from open1b.protocol.hashing import blake2b256
from open1b.protocol.witness import witness_binding, witness_commitment

RESULTS = Path(__file__).parent / "results"


def identity(i: int) -> Identity:
    return Identity(blake2b256(b"bench/earned-trust", i.to_bytes(4, "little")))


def witness(run_tag: int, step: int) -> bytes:
    return blake2b256(b"bench/witness", run_tag.to_bytes(4, "little"), step.to_bytes(8, "little"))


def build(store: Store, runs: int, steps: int, keys: int) -> list[RunManifest]:
    manifests = []
    for r in range(runs):
        publisher = identity(0 if r == 0 else 1000 + r)
        m = RunManifest.create(
            publisher, format=RUN_FORMAT, engine="bench", engine_version="1", model={"d": 1}, data={}, seed=r,
            steps=steps, created_at=int(time.time()) - 100,
            state_hashes=[blake2b256(b"h", bytes([r]), k.to_bytes(8, "little")) for k in range(steps + 1)],
            checkpoints=[blake2b256(b"c", k.to_bytes(8, "little")) for k in range(steps + 1)],
            witnesses=[witness_commitment(witness(r, k)) for k in range(steps)],
            samples_root=blake2b256(b"s"), samples=64, samples_blob=blake2b256(b"b"), samples_size=64 * 33 * 4)
        store.add_manifest(m)
        atts = []
        for k in range(steps):
            store.add_replay_witness(m.run_id, k, witness(r, k))
            for i in range(keys):
                who = identity(i)
                atts.append(Attestation.create(
                    who, run=m.run_id, step=k, pre_state=m.state_hashes[k], post_state=m.state_hashes[k + 1],
                    verdict="match", engine="bench", engine_version="1", hardware="bench", device="cpu/bench",
                    elapsed_ms=1, issued_at=int(time.time()) - 50,
                    witness=witness_binding(m.run_id, k, who.public_key, witness(r, k))))
        store.add_attestations(atts)
        manifests.append(m)
    return manifests


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--keys", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "store.sqlite")
        manifests = build(store, args.runs, args.steps, args.keys)
        roots = frozenset({identity(0).public_key})
        policy = TrustPolicy(ALLOWLIST, roots, 2)
        warm = EarnedTrust(store, roots, 2, EarnRule())
        assert len(warm(manifests, [])) == args.keys - 1  # every other key earns: the bench measures the real path

        def baseline():
            for m in manifests:
                coverage(m, store.attestations(m.run_id), reveals=store.reveals(m.run_id), policy=policy)

        def full():
            EarnedTrust(store, roots, 2, EarnRule())(manifests, [])

        def one_run():
            warm(manifests, [manifests[-1].run_id])

        variants = {"coverage": baseline, "earned, every run read": full, "earned, one run read": one_run}
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.repeats):
            for name, fn in variants.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
        store.close()
    base = statistics.median(times["coverage"])
    out = {"runs": args.runs, "steps": args.steps, "keys": args.keys, "repeats": args.repeats,
           "attestations": args.runs * args.steps * args.keys,
           "median_s": {n: statistics.median(t) for n, t in times.items()},
           "ratio_to_coverage": {n: statistics.median(t) / base for n, t in times.items()}}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "earned_trust.json").write_text(json.dumps(out, indent=1) + "\n")
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
