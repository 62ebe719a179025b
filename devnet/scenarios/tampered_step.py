"""``tampered-step``: the published run has forged states; independent replays must refute exactly
those steps."""

from __future__ import annotations

from open1b.protocol import MISMATCH, Attestation, Open1bError

from .base import Scenario, _result


def _verified_mismatch(encoded: str, manifest, step: int) -> bool:
    """Re-check one piece of evidence from its bytes alone: a validly signed mismatch about
    ``step`` that starts from the published h_step."""
    try:
        att = Attestation.decode(bytes.fromhex(encoded))
    except Open1bError:
        return False
    return (att.run == manifest.run_id and att.step == step and att.verdict == MISMATCH
            and att.pre_state == manifest.state_hashes[step] and att.post_state != manifest.state_hashes[step + 1])


class TamperedStep(Scenario):
    name = "tampered-step"
    waiting = "exactly the forged steps refuted at the observer"

    def forgeries(self) -> dict[int, str]:
        steps = self.opts.steps
        places = sorted({steps // 8, (3 * steps) // 8, (5 * steps) // 8})
        kinds = ["bitflip", "batch", "skip"] if steps >= 2 else ["bitflip"]
        return dict(zip(places, kinds))

    def done(self, net):
        return net.coverage(net.observer)["refuted_steps"] == sorted(self.forgeries())

    def report(self, net):
        forged = self.forgeries()
        cov = net.coverage(net.observer)
        evidence, valid, latency = {}, True, []
        for step in sorted(forged):
            held = {a["digest"]: a for a in net.attestations(net.observer, step)}
            listed = cov["per_step"][step]["evidence"]
            evidence[step] = [held[d]["encoded"] for d in listed if d in held]
            valid &= len(evidence[step]) == len(listed) >= 2
            valid &= all(_verified_mismatch(e, net.manifest, step) for e in evidence[step])
            times = sorted(held[d]["received_at_ms"] for d in listed if d in held)  # counted dissent only
            if len(times) >= 2:
                latency.append(times[1] - times[0])
        others = [s for s in cov["per_step"] if s["step"] not in forged]
        return _result(
            {"what": "forged published states", "count": len(forged), "steps": {str(k): v for k, v in forged.items()}},
            {"what": "steps refuted by independent replays", "count": len(cov["refuted_steps"]),
             "refuted": cov["refuted_steps"], "disputed": cov["disputed_steps"],
             "confirmed_within_ms": max(latency, default=None)},  # first counted mismatch -> second
            0,
            {"exactly the forged steps disputed": cov["disputed_steps"] == sorted(forged),
             "every forged step refuted": cov["refuted_steps"] == sorted(forged),
             "evidence re-checks": valid,
             "every other step verified": all(s["status"] == "verified" for s in others)},
            evidence=evidence)
