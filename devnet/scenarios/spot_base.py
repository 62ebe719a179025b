"""What the four spot-check scenarios share (docs/protocol.md §5.5, docs/run-format.md §10.3): a
run published with fingerprints, auditors that spot check it beside their replays with a short answer
deadline, and a report of which check caught the forgery, when, and the escape probability.

A scenario is caught when the observer's spot coverage fails the forged step (or, for a trainer
that forged nothing but does not answer, any step). ``flagged_s`` and ``covered_s`` are the
seconds from the start of the run's publication to the first poll that saw the failure, and to the
first poll that saw replay coverage complete (the driver polls from when the publisher holds the
run: auditors learn it by sync while its blobs are still being provided): "caught before full coverage" is ``flagged_s <= covered_s``
at the driver's poll granularity (:data:`~.base.POLL_S`), or coverage not complete at all.
"""

from __future__ import annotations

from .base import Net, Scenario, _result


class SpotScenario(Scenario):
    forgery = ""  # the forged run's kind (devnet/forged_run.py); "" publishes an honest run
    expected: tuple[str, ...] = ()  # the links that may catch it (docs/run-format.md §10.3)
    what = ""
    # The devnet's answer deadline (the spec's ANSWER_SECONDS is an hour): long enough for a
    # publisher's first answer on a loaded machine (its worker starts and compiles on first use), and
    # for its turn: the publisher answers one challenge per key at a time and says `busy` to the
    # rest. With 20 s, a second devnet beside made an honest step's answer come 18.6 s after its
    # slot's check, past the deadline: that step failed by no_answer (forged-data, under load, 1 of 3).
    answer_s = 90.0
    # Seconds each replay is slowed by (``--behaviour slow``): a `tiny` step costs about as much to
    # replay as to spot check (fixed costs dominate), while a real step costs a replay tens of spot
    # checks (docs/benchmarks.md). The delay gives a devnet of a few steps those proportions, so that
    # "caught before full coverage" tests the spot checks, not a race. bench/flag_time.py sets 0.
    replay_delay_s = 2.0
    # ... and at least this many times as long as the honest replay: on a loaded machine the replay
    # and the spot check both slow down, and a fixed delay no longer keeps the proportion (a second
    # devnet beside: forged-data flagged 80.2 s after publishing began, coverage complete at 89.4 s)
    replay_times = 4.0
    lanes: int | None = None  # every auditor's --spot-checks-in-flight (bench/flag_time.py); None: the default
    at = 0.5  # the forged step is ⌊steps · at⌋: distinct per scenario, so that they combine in one devnet
    min_auditors = 2
    waiting = "a spot check failing the forged step (any step, for an honest run) at the observer"

    def __init__(self, opts) -> None:
        super().__init__(opts)
        self.flagged_at: float | None = None

    def forged_step(self) -> int | None:
        return int(self.opts.steps * self.at) if self.forgery else None

    def forgeries(self) -> dict[int, str]:
        step = self.forged_step()
        return {step: self.forgery} if step is not None else {}

    def auditor_args(self) -> tuple[str, ...]:
        slow = ("--behaviour", f"slow={self.replay_delay_s},{self.replay_times}") if self.replay_delay_s else ()
        lanes = ("--spot-checks-in-flight", str(self.lanes)) if self.lanes is not None else ()
        return ("--answer-seconds", str(self.answer_s), *slow, *lanes)

    def _flagged(self, spot: dict) -> bool:
        step = self.forged_step()
        return step in spot["spot_failed_steps"] if step is not None else bool(spot["spot_failed_steps"])

    def tick(self, net: Net) -> None:
        if self.flagged_at is None and self._flagged(net.coverage(net.observer)["spot_checks"]):
            self.flagged_at = net.poll_at

    def done(self, net: Net) -> bool:
        return self.flagged_at is not None

    def report(self, net: Net) -> dict:
        cov = net.coverage(net.observer)
        spot = cov["spot_checks"]
        per_step = {s["step"]: s for s in spot["per_step"]}
        failed = spot["spot_failed_steps"]
        verified = {s["step"] for s in cov["per_step"] if s["status"] == "verified"}
        step = self.forged_step()
        # the links that failed this scenario's step (others may share the devnet with their own)
        caught = sorted({link for k in failed if step is None or k == step for link in per_step[k]["caught"]})
        start = net.publishing_at
        flagged_s = None if self.flagged_at is None else round(self.flagged_at - start, 2)
        covered_s = None if net.covered_at is None else round(net.covered_at - start, 2)
        held = net.get(net.observer, f"/v1/spotchecks/{net.run}")
        evidence = [sc["encoded"] for sc in held if sc["verdict"] == "fail" and (step is None or sc["step"] == step)]
        return _result(
            {"what": self.what, "count": 1, "step": step},
            {"what": "steps a spot check failed", "count": len(failed), "failed": failed, "caught": caught,
             "flagged_s": flagged_s, "covered_s": covered_s, "published_s": round(net.published_at - start, 2),
             "flag_over_coverage": round(flagged_s / covered_s, 3) if flagged_s is not None and covered_s else None,
             "escape_one_forged": spot["escape_one_forged"], "detection_per_check": spot["detection_per_check"],
             "spot_checked_steps": spot["spot_checked_steps"]},
            0,
            {"the run was spot checked": spot["spot_checkable"],
             "a spot check failed it": self._flagged(spot),
             f"caught by {' or '.join(self.expected)}": bool(caught) and set(caught) <= set(self.expected),
             "caught before full coverage": flagged_s is not None and (covered_s is None or flagged_s <= covered_s),
             # (a trainer that does not answer fails honest steps too: that is the rule, §5.5)
             **({"no step replays verified failed a spot check": not set(failed) & verified} if step is not None else {})},
            evidence=evidence)  # the failing spot checks themselves (hex), for anyone to re-check
