"""``forged-microbatch``: one micro-batch's gradient is forged and every commitment follows from it
(its root, the sum, the update); the publishing node answers challenges as the forger would
(``--behaviour forger``), consistently with those commitments. Only a challenge whose secret slot
is the forged one catches it, by comparing that micro-batch's recomputation with the answer
(``gradient``): 1 / (ranks × micro_batches) per check, the least of docs/run-format.md §10.3.

So that the devnet shows that link at work rather than the odds (which bench/spotcheck_bench.py
measures over random challenges), it chooses the manifest's ``created_at`` — and so the run ID
that every challenge signs — such that each auditor's challenge of the forged step selects the
forged slot. A real trainer cannot do this: it does not hold the auditors' keys, and the slot's
signature is revealed only after it has answered. The report says so
(``challenges_aimed``) beside the per-check detection the spec states.
"""

from __future__ import annotations

from pathlib import Path

from open1b.deterministic.runfile import MANIFEST_FILE
from open1b.node.files import write_atomic
from open1b.protocol import Identity, RunManifest, derive_slot, slot_signature
from open1b.protocol.spotcheck import run_slots

from ..forged_run import forged_slot
from ..options import DevnetError
from .spot_base import SpotScenario

MAX_TRIES = 1 << 20  # each try is one signature per auditor; 4 auditors of 4 slots need ~256


class ForgedMicrobatch(SpotScenario):
    name = "forged-microbatch"
    forgery = "forged-microbatch"
    expected = ("gradient",)
    what = "a step with one forged micro-batch gradient"
    at = 0.75

    def observer_args(self) -> tuple[str, ...]:
        return ("--behaviour", "forger")

    def prepare_run(self, run_dir: Path, manifest: RunManifest, publisher: Identity,
                    auditors: list[Identity]) -> RunManifest:
        step, slots = self.forged_step(), run_slots(manifest)
        target = forged_slot(step, slots)
        fields = {k: v for k, v in manifest.body().items() if k not in ("kind", "v", "publisher")}
        for earlier in range(MAX_TRIES):  # created_at is not in h_0's genesis: the chain stays valid
            candidate = RunManifest.create(publisher, **{**fields, "created_at": manifest.created_at - earlier})
            if all(derive_slot(slot_signature(a, candidate.run_id, step), slots) == target for a in auditors):
                write_atomic(run_dir / MANIFEST_FILE, candidate.encoded)
                return candidate
        raise DevnetError(f"no created_at within {MAX_TRIES} s aims every challenge at slot {target}")

    def report(self, net) -> dict:
        out = super().report(net)
        out["detected"]["challenges_aimed"] = "every auditor's challenge of the forged step selects the forged slot"
        return out
