"""Every operator command against a live network of real daemon processes on loopback."""

import json
import os
import re
import signal
import socket

import pytest

from open1b.deterministic.device import cpu_device_class
from open1b.devnet import Daemons
from open1b.node.client import call
from open1b.node.metrics import METRIC_NAMES

from .commands import cli, wait_for

pytestmark = pytest.mark.integration

@pytest.fixture(scope="module")
def network(tmp_path_factory, tampered_run):
    run_dir, manifest = tampered_run
    workdir = tmp_path_factory.mktemp("net")
    notify_path = str(workdir / "notify.sock")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(notify_path)
    notify.settimeout(60)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        metrics_port = s.getsockname()[1]
    daemons = Daemons(workdir, run_dir, redundancy=1)
    addrs = daemons.plan(4)
    for i in range(4):
        # no spot checks: when they would land against this run's replays is a race, and the
        # coverage test below pins what replays alone give (spot checks: tests/scenarios)
        extra = ("--no-spot-checks", *(("--metrics", f"127.0.0.1:{metrics_port}") if i == 0 else ()))
        env = {"NOTIFY_SOCKET": notify_path} if i == 0 else None
        daemons.start(i, audit=i < 3, bootstrap=[addrs[1 if i == 0 else 0]], extra_args=extra, env=env)
    observer = daemons.api(3)
    run_hex = manifest.run_id.hex()
    try:
        rc, out, err = cli("publish", str(run_dir), "--data-dir", str(daemons.dirs[3]), "--json")  # only the observer sees run_dir
        assert rc == 0, err
        assert json.loads(out)["run"] == run_hex
        wait_for(lambda: call(observer, f"/v1/coverage/{run_hex}")["complete"], 90, what="coverage")
        yield {"daemons": daemons, "manifest": manifest, "run_dir": run_dir, "run": run_hex, "observer": observer,
               "metrics": f"127.0.0.1:{metrics_port}", "notify": notify, "addrs": addrs}
    finally:
        daemons.stop()
        notify.close()


def test_systemd_readiness_is_notified(network):
    assert network["notify"].recv(64) == b"READY=1"


def test_status_peers_runs_and_key_show(network):
    d0 = str(network["daemons"].dirs[0])
    rc, out, err = cli("status", "--data-dir", d0, "--json")  # API found through the data dir's api.addr
    assert rc == 0, err
    status = json.loads(out)
    assert status["runs"] == [network["run"]] and len(status["peers"]) >= 2
    rc, out, _ = cli("key", "show", "--data-dir", d0, "--json")
    key = json.loads(out)
    assert key["peer_id"] == status["peer_id"]
    seed = (network["daemons"].dirs[0] / "keystore" / "identity.key").read_bytes()
    assert seed.hex() not in out
    rc, out, _ = cli("peers", "--api", network["observer"], "--json")
    assert rc == 0 and {p["peer_id"] for p in json.loads(out)} >= {status["peer_id"]}
    rc, out, _ = cli("runs", "--api", network["observer"])
    assert rc == 0 and network["run"] in out
    rc, out, _ = cli("status", "--api", network["observer"])
    assert rc == 0 and "observer" in out
    rc, out, _ = cli("status", "--data-dir", d0, "--json")  # an auditor: its worker chose the CPU here
    device = json.loads(out)["device"]
    assert device == {"requested": "auto", "class": cpu_device_class(), "reason": device["reason"]} and device["reason"]


def test_coverage_attestations_and_claims(network):
    rc, out, _ = cli("coverage", network["run"][:10], "--api", network["observer"], "--json")
    cov = json.loads(out)
    assert cov["disputed_steps"] == [2] and cov["verified_steps"] == network["manifest"].steps - 1
    # no spot checks (the fixture): a run with one forged step escapes only through the steps replay
    # has not decided (§8.7): step 2 while it is disputed, none once a quorum has refuted it
    spot = cov["spot_checks"]
    assert spot["spot_checked_steps"] == 0 and spot["spot_failed_steps"] == []
    undecided = network["manifest"].steps - cov["verified_steps"] - len(cov["refuted_steps"])
    assert undecided in (0, 1) and spot["escape_one_forged"] == pytest.approx(undecided / network["manifest"].steps)
    rc, out, _ = cli("coverage", network["run"][:10], "--api", network["observer"])
    assert rc == 0 and "escape probability of a forged run" in out
    rc, out, _ = cli("attestations", network["run"], "--step", "2", "--api", network["observer"], "--json")
    atts = json.loads(out)
    assert atts and all(a["verdict"] == "mismatch" and a["step"] == 2 for a in atts)
    rc, out, _ = cli("attestations", network["run"], "--api", network["observer"])
    assert rc == 0 and "mismatch" in out and "match" in out
    rc, out, _ = cli("claims", "--api", network["observer"], "--json")
    assert rc == 0 and all(c["run"] == network["run"] for c in json.loads(out))


def test_replay_by_directory_and_by_run_id(network):
    rc, out, _ = cli("replay", str(network["run_dir"]), "--step", "1", "--json")
    result = json.loads(out)
    assert rc == 0 and result["verdict"] == "match"
    assert result["published_post_state"] == result["replayed_post_state"]
    assert result["device"] == cpu_device_class()  # no GPU here: auto chose the CPU, and says why
    # a GPU asked for and absent: the CPU replays (the same bits), and the answer says so
    rc, out, _ = cli("replay", str(network["run_dir"]), "--step", "1", "--device", "cuda", "--json")
    result = json.loads(out)
    assert rc == 0 and result["verdict"] == "match" and result["device"] == cpu_device_class()
    assert "cuda:0 is not available" in result["device_reason"] and "using the CPU" in result["device_reason"]
    rc, out, err = cli("replay", str(network["run_dir"]), "--step", "1", "--device", "tpu")
    assert rc == 1 and out == "" and len(err.strip().splitlines()) == 1 and "device must be auto, cpu" in err
    rc, out, err = cli("replay", network["run"][:12], "--step", "2", "--data-dir", str(network["daemons"].dirs[1]))
    assert rc == 2 and re.search(r"verdict\s+mismatch", out), err
    # the node held the files for the command in the operator's directory, and let go once it was done
    held = network["daemons"].dirs[1] / "runs" / f"{network['run']}-operator"
    assert (held / "samples.bin").exists() and not list(held.glob("checkpoints/*"))


def test_doctor(network):
    rc, out, err = cli("doctor", "--data-dir", str(network["daemons"].dirs[0]), "--json")
    checks = {c["check"]: c for c in json.loads(out)}
    assert rc == (1 if checks["overall"]["level"] == "FAIL" else 0)
    assert all(c["level"] == "OK" for name, c in checks.items() if name.startswith("determinism"))
    assert checks["daemon"]["level"] == "OK" and checks["key file"]["level"] == "OK"
    # the truth about the GPU: none here, so auto replays on the CPU, which the running node reports
    assert checks["gpu"]["level"] == "OK" and "replays on the CPU" in checks["gpu"]["detail"]
    assert checks["replay device"]["detail"].startswith(cpu_device_class() + ":")
    # four daemons on loopback dial each other back at 127.0.0.1: reachable, but on this machine only
    d0 = network["daemons"].api(0)
    wait_for(lambda: call(d0, "/v1/status")["reachability"]["state"] != "unknown", 90, what="a reachability verdict")
    reach = call(d0, "/v1/status")["reachability"]
    assert reach["state"] == "private" and "127.0.0.1" in reach["reason"] and "that network only" in reach["reason"]
    rc, out, err = cli("doctor", "--data-dir", str(network["daemons"].dirs[0]), "--json")
    checks = {c["check"]: c for c in json.loads(out)}
    assert checks["reachability"] == {"check": "reachability", "level": "WARN",
                                      "detail": f"private: {reach['reason']}"}
    rc, out, err = cli("doctor", "--data-dir", str(network["daemons"].dirs[0]), "--device", "cuda", "--json")
    checks = {c["check"]: c for c in json.loads(out)}
    assert checks["gpu"]["level"] == "WARN" and checks["overall"]["level"] in ("WARN", "FAIL")


def test_metrics_golden_list(network):
    import urllib.request

    d0 = network["daemons"].api(0)
    wait_for(lambda: call(d0, "/v1/status")["reachability"]["state"] != "unknown", 90, what="a reachability verdict")
    text = urllib.request.urlopen(f"http://{network['metrics']}/metrics", timeout=5).read().decode()
    assert set(re.findall(r"^# TYPE (\S+) ", text, re.M)) == set(METRIC_NAMES)
    status = call(network["daemons"].api(0), "/v1/status")
    assert f"open1b_replays_total {float(status['replays'])}" in text
    state = status["reachability"]["state"]
    assert all(f'open1b_reachability{{state="{s}"}} {1.0 if s == state else 0.0}' in text
               for s in ("public", "private", "unknown"))
    # on loopback nobody relays nor punches: zeros, labelled as documented
    assert all(f'open1b_relay_reservations{{role="{role}"}} 0.0' in text for role in ("held", "served"))
    assert all(f'open1b_hole_punches_total{{event="{e}"}} 0.0' in text for e in ("attempted", "succeeded", "answered"))
    assert 'open1b_relay_requests_refused_total{reason="full"} 0.0' in text
    assert 'open1b_bulk_dialbacks_total{result="served"} 0.0' in text
    policy = call(network["daemons"].api(0), f"/v1/coverage/{network['run']}")["policy"]
    listed, earned = len(policy["roots"]) - len(policy["earned"]), len(policy["earned"])
    assert f'open1b_trusted_keys{{source="listed"}} {float(listed)}' in text and listed >= 1
    assert f'open1b_trusted_keys{{source="earned"}} {float(earned)}' in text


def test_second_daemon_on_the_same_data_dir_is_refused(network):
    d0 = str(network["daemons"].dirs[0])
    rc, _, err = cli("daemon", "--data-dir", d0, "--listen", "127.0.0.1:0", "--api", "127.0.0.1:0", timeout=60)
    assert rc == 1 and "another daemon" in err


def verdicts(api, run):
    """Coverage as attestations decide it (claims are short-lived hints and are not synced)."""
    cov = call(api, f"/v1/coverage/{run}")
    return [(s["step"], s["status"], s["auditors"], s["dissenters"]) for s in cov["per_step"]]


def test_late_joiner_and_kill_9_restart_converge(network):
    daemons, run = network["daemons"], network["run"]
    reference = verdicts(network["observer"], run)
    # a node that joins after the run is covered catches up through sync
    (late_addr,) = daemons.plan(1)
    daemons.start(4, audit=False, bootstrap=[network["addrs"][0]])
    wait_for(lambda: run in call(daemons.api(4), "/v1/status")["runs"], 90, what="late joiner to learn the run")
    wait_for(lambda: verdicts(daemons.api(4), run) == reference, 90, what="late joiner to converge")
    # an auditor killed with SIGKILL keeps every attestation it had
    before = call(daemons.api(1), "/v1/status")["attestations_stored"]
    os.kill(daemons.procs[1].pid, signal.SIGKILL)
    daemons.procs[1].wait()
    (daemons.dirs[1] / "api.addr").unlink()
    daemons.start(1, audit=True, bootstrap=[network["addrs"][0]])
    wait_for(lambda: call(daemons.api(1), "/v1/status")["attestations_stored"] >= before, 90, what="restarted node")
    assert verdicts(daemons.api(1), run) == reference
