"""The README's "Running several nodes yourself", command for command, with real daemons (CLI
subprocesses, libp2p on loopback) and no `trust add`: three nodes (redundancy 3, as the README
sets it) each train and publish a small run, and every node's coverage of every run completes
because the others earn its trust (docs/protocol.md §8.1.1) — issue 15's "coverage never completes
in the README's own flow"."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from open1b.node.client import call

from .commands import CLI, cli, wait_for

pytestmark = pytest.mark.integration

NODES, STEPS = ("a", "b", "c"), 2
REPO = Path(__file__).resolve().parents[2]


def clis(commands):
    """Run several ``open1b-node`` commands at once; (exit code, stdout, stderr) of each, in order."""
    procs = [subprocess.Popen([*CLI, *c], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in commands]
    outs = [p.communicate(timeout=300) for p in procs]
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outs)]


def test_three_nodes_that_each_publish_a_run_cover_every_run_without_trust_add(tmp_path):
    dirs = {n: tmp_path / n for n in NODES}
    for n in NODES:  # open1b-node init --data-dir …, then redundancy = 3 in config.toml (as the README says)
        rc, _, err = cli("init", "--data-dir", str(dirs[n]))
        assert rc == 0, err
        config = dirs[n] / "config.toml"
        assert "redundancy = 2\n" in config.read_text()
        config.write_text(config.read_text().replace("redundancy = 2\n", "redundancy = 3\n"))
    peer = {n: json.loads(cli("key", "show", "--data-dir", str(dirs[n]), "--json")[1])["peer_id"] for n in NODES}
    # open1b-node train --steps N --out RUN_DIR --data-dir …, on every node at once
    for rc, _, err in clis([("train", "--steps", str(STEPS), "--out", str(tmp_path / f"run-{n}"), "--data-dir",
                             str(dirs[n])) for n in NODES]):
        assert rc == 0, err
    procs = {}

    def daemon(n, *args):  # open1b-node daemon [--bootstrap the first one's p2p.addr]
        procs[n] = subprocess.Popen([*CLI, "daemon", "--data-dir", str(dirs[n]), *args],
                                    stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"{n}.log", "wb"))

    try:
        daemon("a")
        wait_for(lambda: (dirs["a"] / "p2p.addr").exists(), 60, what="the first daemon")
        for n in NODES[1:]:
            daemon(n, "--bootstrap", (dirs["a"] / "p2p.addr").read_text().strip())
        wait_for(lambda: all((dirs[n] / "api.addr").exists() for n in NODES), 60, what="the daemons")
        runs = {}  # open1b-node publish RUN_DIR --data-dir …, on every node at once
        for n, (rc, out, err) in zip(NODES, clis([("publish", str(tmp_path / f"run-{n}"), "--data-dir", str(dirs[n]),
                                                   "--json") for n in NODES])):
            assert rc == 0, err
            runs[n] = json.loads(out)["run"]

        api = {n: (dirs[n] / "api.addr").read_text().strip() for n in NODES}

        def all_complete():  # polled through the API: a CLI process per poll costs seconds here
            return all(call(api[n], f"/v1/coverage/{r}")["complete"] for n in NODES for r in runs.values())

        wait_for(all_complete, 90, what="every node's coverage of every run")
        # open1b-node coverage RUN and trust list, on every node
        answers = clis([(what, *([runs[n]] if what == "coverage" else ["list"]), "--data-dir", str(dirs[n]), "--json")
                        for n in NODES for what in ("coverage", "trust")])
        for i, n in enumerate(NODES):
            others = sorted(peer[m] for m in NODES if m != n)
            (rc, cov, err), (rc2, trust, err2) = answers[2 * i: 2 * i + 2]
            assert rc == 0 and rc2 == 0, err + err2
            for c in [json.loads(cov), *(call(api[n], f"/v1/coverage/{r}") for r in runs.values())]:
                assert c["redundancy"] == 3 and c["untrusted"] == [] and c["policy"]["earned"] == others
                assert all(len(s["auditors"]) == 3 and s["status"] == "verified" for s in c["per_step"])
            listed = json.loads(trust)
            assert listed["trusted_peers"] == [] and [e["peer_id"] for e in listed["earned"]] == others
            for e in listed["earned"]:  # the evidence: proven pairs, none on the earning key's own run
                assert len(e["pairs"]) >= 3 and all(p["publisher"] != e["peer_id"] for p in e["pairs"])
        # open1b-node attestations RUN --out FILE, then the library's example on that file (issue 33, item 7)
        hexfile = tmp_path / "attestations.hex"
        rc, out, err = cli("attestations", runs["a"], "--data-dir", str(dirs["a"]), "--out", str(hexfile))
        assert rc == 0 and "attestations written to" in out, err
        example = subprocess.run([sys.executable, str(REPO / "examples" / "verify_coverage.py"),
                                  str(tmp_path / "run-a" / "manifest.cbor"), str(hexfile), "3"],
                                 capture_output=True, text=True, timeout=60)
        assert example.returncode == 0, example.stdout + example.stderr
        assert example.stdout.splitlines()[-1] == f"{STEPS}/{STEPS} verified, disputed [], complete True"
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
