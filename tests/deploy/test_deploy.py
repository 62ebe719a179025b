"""The deployment files are checked here as far as this machine allows (no Docker engine here:
images are not built; the systemd unit is verified by systemd itself)."""

import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from open1b.node.cli import parser
from open1b.node.metrics import METRIC_NAMES

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def _parses(argv: list[str]) -> None:
    parser().parse_args(argv)  # argparse exits (SystemExit) on an unknown command or flag


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_unit_verifies(tmp_path):
    unit = (DEPLOY / "systemd" / "open1b-node.service").read_text()
    assert "Type=notify" in unit and "ProtectSystem=strict" in unit and "DynamicUser=yes" in unit
    exe = str(Path(sys.executable).with_name("open1b-node"))
    local = tmp_path / "open1b-node.service"
    local.write_text(unit.replace("/opt/open1b/.venv/bin/open1b-node", exe))
    proc = subprocess.run(["systemd-analyze", "verify", str(local)], capture_output=True, text=True)
    problems = [line for line in proc.stderr.splitlines() if "open1b-node.service" in line]
    assert proc.returncode == 0 and not problems, proc.stderr
    for line in unit.splitlines():
        if line.startswith(("ExecStart=", "ExecStartPre=")):
            _parses(shlex.split(line.split("=", 1)[1])[1:])


def test_dockerfiles_install_the_node_and_run_a_real_command():
    for name in ("Dockerfile.cpu", "Dockerfile.cuda"):
        text = (DEPLOY / "docker" / name).read_text()
        for folder in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values():
            assert f"COPY {folder} ./{folder}" in text  # pip refuses a listed package whose folder is missing
        assert "'.[node]'" in text and "libgmp-dev" in text
        assert json.loads(re.search(r"^ENTRYPOINT (.*)$", text, re.M).group(1)) == ["open1b-node"]
        _parses(json.loads(re.search(r"^CMD (.*)$", text, re.M).group(1)))


def test_compose_services_run_real_commands_and_are_scraped():
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert {"trainer", "node0", "node1", "node2", "observer", "prometheus", "grafana"} <= set(services)
    _parses(services["trainer"]["command"])
    metrics_services = set()
    for name, svc in services.items():
        for script in svc.get("command", []) if svc.get("entrypoint") == ["/bin/sh", "-c"] else []:
            for invocation in re.findall(r"(?:exec )?open1b-node ([^&;|]+)", script):
                argv = shlex.split(invocation.replace("$(cat /shared/node0.id)", "12D3KooWPEER"))
                _parses(argv)
                if "--metrics" in argv:
                    metrics_services.add(name)
        for port in svc.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"
    prometheus = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    targets = {t.split(":")[0] for job in prometheus["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    assert targets == metrics_services


def test_dashboard_queries_only_exported_metrics():
    dashboard = json.loads((DEPLOY / "grafana" / "open1b-dashboard.json").read_text())
    used = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            used |= set(re.findall(r"open1b_[a-z_]+", target["expr"]))
    exported = set(METRIC_NAMES) | {m + suffix for m in METRIC_NAMES for suffix in ("_bucket", "_sum", "_count")}
    assert used and used <= exported
    assert {m for m in METRIC_NAMES} <= {re.sub(r"_(bucket|sum|count)$", "", u) for u in used}
