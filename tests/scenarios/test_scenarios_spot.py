"""Devnet scenarios: spot checks catch forged data, a skipped update and a forged micro-batch;
a publisher that never answers fails every spot check."""

from __future__ import annotations

import time

import pytest

from open1b.protocol import (
    validate_spotcheck,
)

from .devnets import assert_network_kept_its_promises, devnet

pytestmark = pytest.mark.integration


# -- spot checks: forged-data, skipped-update, forged-microbatch in one devnet; refusing-trainer ---
def _recheck_spot_evidence(report: dict, manifest, step: int | None, links: tuple[str, ...]) -> None:
    """Each failing spot check in the report, decoded and judged here by the protocol's own rules
    against the published manifest: a valid ``fail`` of the forged step, by a link the spec names."""
    assert report["evidence"]
    for encoded in report["evidence"]:
        verdict = validate_spotcheck(bytes.fromhex(encoded), {manifest.run_id: manifest}.get, int(time.time()))
        assert verdict.accepted, verdict.code
        sc = verdict.message
        assert sc.verdict == "fail" and sc.caught in links and (step is None or sc.step == step)


@pytest.fixture(scope="module")
def forged_for_spot_checks(tmp_path_factory):
    return devnet(tmp_path_factory.mktemp("spot"), "forged-data", "skipped-update", "forged-microbatch")


@pytest.mark.parametrize("name, links", [("forged-data", ("loss", "gradient")), ("skipped-update", ("update",)),
                                         ("forged-microbatch", ("loss", "gradient"))])
def test_spot_checks_catch_each_forgery_before_full_coverage(forged_for_spot_checks, name, links):
    s, manifest = forged_for_spot_checks, forged_for_spot_checks["manifest"]
    assert_network_kept_its_promises(s)
    report = s["scenarios"][name]
    step = report["injected"]["step"]
    assert s["forged_steps"][str(step)] == name
    assert report["ok"], report["checks"]
    assert step in report["detected"]["failed"] and set(report["detected"]["caught"]) <= set(links)
    assert report["detected"]["flagged_s"] <= report["detected"]["covered_s"]
    assert 0 <= report["detected"]["escape_one_forged"] <= 1
    _recheck_spot_evidence(report, manifest, None, links)
    assert step in s["disputed_steps"]  # replays, taken first where the spot check failed, agree


def test_a_publisher_that_never_answers_fails_every_spot_check(tmp_path):
    s = devnet(tmp_path, "refusing-trainer")
    assert_network_kept_its_promises(s)
    report = s["scenarios"]["refusing-trainer"]
    assert report["ok"], report["checks"]
    assert report["detected"]["caught"] == ["no_answer"]
    _recheck_spot_evidence(report, s["manifest"], None, ("no_answer",))
    assert s["verified_steps"] == s["steps"]  # the run itself is honest: replays verify every step
