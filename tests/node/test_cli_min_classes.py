"""``open1b-node coverage --min-classes N``: an operator's policy on device classes per step,
judged from the coverage answer's per-step device classes (docs/protocol.md §10.1)."""

from open1b.node import cli


def _answer(devices_per_step):
    return {"run": "ab" * 32, "steps": len(devices_per_step), "redundancy": 2, "verified_steps": len(devices_per_step),
            "disputed_steps": [], "refuted_steps": [], "claimed_steps": 0, "unaudited_steps": 0, "complete": True,
            "policy": {"name": "open", "roots": [], "earned": [], "quorum": 0}, "flagged": [], "untrusted": [],
            "per_step": [{"step": k, "status": "verified", "auditors": [], "dissenters": [], "claimants": [],
                          "devices": d} for k, d in enumerate(devices_per_step)]}


def _coverage(monkeypatch, answer, *argv):
    monkeypatch.setattr(cli, "_call", lambda args, path, shape, **kw: answer)
    args = cli.parser().parse_args(["coverage", "ab", *argv])
    return args.func(args)


def test_min_classes_fails_when_a_step_has_fewer(monkeypatch):
    answer = _answer([["cpu/x86_64", "cuda/sm_90"], ["cuda/sm_90", "cuda/sm_90"], ["cpu/arm64", "cuda/sm_86"]])
    result = _coverage(monkeypatch, answer, "--min-classes", "2")
    assert result.exit_code == 2
    text = result.render(result.data)
    assert "1 of 3 steps matched by fewer than 2 (first: 1)" in text
    assert "cpu/arm64, cpu/x86_64, cuda/sm_86, cuda/sm_90" in text


def test_min_classes_passes_and_is_off_by_default(monkeypatch):
    answer = _answer([["cpu/x86_64", "cuda/sm_90"], ["cuda/sm_90"]])
    assert _coverage(monkeypatch, answer, "--min-classes", "1").exit_code == 0
    plain = _coverage(monkeypatch, answer)
    assert plain.exit_code == 0 and "device classes" not in plain.render(plain.data)


def test_min_classes_below_one_is_refused_in_one_line(capsys):
    import pytest

    for value in ("0", "-1"):
        with pytest.raises(SystemExit) as exit_:
            cli.parser().parse_args(["coverage", "ab", "--min-classes", value])
        assert exit_.value.code == 2
        assert "--min-classes: must be at least 1" in capsys.readouterr().err
