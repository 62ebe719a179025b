"""The README's "Running several nodes yourself", command for command, with real daemons (CLI
subprocesses, libp2p on loopback) and no `trust add`: three nodes each train and publish a small
run, and every node's coverage of every run completes because the others earn its trust
(docs/protocol.md §8.1) — issue 15's "coverage never completes in the README's own flow"."""

from __future__ import annotations

import json
import subprocess

import pytest

from open1b.node.client import call

from .commands import CLI, cli, wait_for

pytestmark = pytest.mark.integration

NODES, STEPS = ("a", "b", "c"), 2


def test_three_nodes_that_each_publish_a_run_cover_every_run_without_trust_add(tmp_path):
    dirs = {n: tmp_path / n for n in NODES}
    for n in NODES:  # open1b-node init --data-dir …, then lease_seconds = 10 in config.toml (as the README says)
        rc, _, err = cli("init", "--data-dir", str(dirs[n]))
        assert rc == 0, err
        config = dirs[n] / "config.toml"
        assert "lease_seconds = 120\n" in config.read_text()
        config.write_text(config.read_text().replace("lease_seconds = 120\n", "lease_seconds = 10\n"))
    peer = {n: json.loads(cli("key", "show", "--data-dir", str(dirs[n]), "--json")[1])["peer_id"] for n in NODES}
    for n in NODES:  # open1b-node train --steps N --out RUN_DIR --data-dir …
        rc, _, err = cli("train", "--steps", str(STEPS), "--out", str(tmp_path / f"run-{n}"), "--data-dir",
                         str(dirs[n]), timeout=300)
        assert rc == 0, err
    procs = {}
    try:
        for n in NODES:  # open1b-node daemon [--bootstrap the first one's p2p.addr]
            boot = ("--bootstrap", (dirs["a"] / "p2p.addr").read_text().strip()) if n != "a" else ()
            procs[n] = subprocess.Popen([*CLI, "daemon", "--data-dir", str(dirs[n]), *boot],
                                        stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"{n}.log", "wb"))
            wait_for(lambda: (dirs[n] / "api.addr").exists(), 60, what=f"daemon {n}")
        runs = {}
        for n in NODES:  # open1b-node publish RUN_DIR --data-dir …
            rc, out, err = cli("publish", str(tmp_path / f"run-{n}"), "--data-dir", str(dirs[n]), "--json")
            assert rc == 0, err
            runs[n] = json.loads(out)["run"]

        api = {n: (dirs[n] / "api.addr").read_text().strip() for n in NODES}

        def all_complete():  # polled through the API: a CLI process per poll costs seconds here
            return all(call(api[n], f"/v1/coverage/{r}")["complete"] for n in NODES for r in runs.values())

        wait_for(all_complete, 90, what="every node's coverage of every run")
        for n in NODES:  # open1b-node coverage RUN / trust list, on every node
            others = sorted(peer[m] for m in NODES if m != n)
            rc, out, err = cli("coverage", runs[n], "--data-dir", str(dirs[n]), "--json")
            assert rc == 0, err
            for c in [json.loads(out), *(call(api[n], f"/v1/coverage/{r}") for r in runs.values())]:
                assert c["redundancy"] == 2 and c["untrusted"] == [] and c["policy"]["earned"] == others
                assert all(len(s["auditors"]) >= 2 and s["status"] == "verified" for s in c["per_step"])
            rc, out, err = cli("trust", "list", "--data-dir", str(dirs[n]), "--json")
            assert rc == 0, err
            listed = json.loads(out)
            assert listed["trusted_peers"] == [] and [e["peer_id"] for e in listed["earned"]] == others
            for e in listed["earned"]:  # the evidence: proven pairs, none on the earning key's own run
                assert len(e["pairs"]) >= 3 and all(p["publisher"] != e["peer_id"] for p in e["pairs"])
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
