"""The devnet's network partition cleans up after a killed run (needs root and iproute2, as the
partition scenario does)."""

import os
import subprocess
import sys

from open1b.devnet.netns import LOCK_PATH, Partition, clear_stale


def _names(*cmd: str) -> set[str]:
    out = subprocess.run(list(cmd), capture_output=True, text=True, check=True).stdout
    return {line.split()[0].split("@")[0] for line in out.splitlines() if line.strip()}


def test_a_killed_runs_namespaces_and_links_are_cleared_before_the_next_partition():
    live = {int(p) % 100000 for p in os.listdir("/proc") if p.isdigit()}
    dead = next(n for n in range(99999, 0, -1) if n not in live)
    ns, outer, inner = f"o1b{dead}a", f"o1b{dead}mah", f"o1b{dead}ma"
    # what a run killed mid-partition leaves: its namespace, and its host-side management link
    # holding the address every partition's half A uses
    subprocess.run(["ip", "netns", "add", ns], check=True)
    subprocess.run(["ip", "link", "add", inner, "type", "veth", "peer", "name", outer], check=True)
    subprocess.run(["ip", "link", "set", inner, "netns", ns], check=True)
    subprocess.run(["ip", "addr", "add", "10.232.1.254/24", "dev", outer], check=True)
    try:
        partition = Partition()
        with partition as (a, b):
            assert ns not in _names("ip", "netns", "list") and outer not in _names("ip", "-br", "link")
            # this host reaches half A's API address through the new run's management link
            route = subprocess.run(["ip", "-o", "route", "get", a.api_address], capture_output=True, text=True)
            assert f"dev {partition.mgmt[0][1]} " in route.stdout, route.stdout + route.stderr
            assert f"o1b{os.getpid() % 100000}a" not in clear_stale()  # a live run's namespace is kept
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", outer], capture_output=True)


TRY_LOCK = f"import fcntl; fcntl.flock(open({LOCK_PATH!r}, 'a'), fcntl.LOCK_EX | fcntl.LOCK_NB)"


def _holders() -> set[int]:
    """The pids holding a flock on LOCK_PATH, from /proc/locks ("1: FLOCK ADVISORY WRITE pid maj:min:inode …")."""
    inode = os.stat(LOCK_PATH).st_ino
    with open("/proc/locks") as f:
        fields = [line.split() for line in f]
    return {int(x[4]) for x in fields if len(x) > 5 and x[1] == "FLOCK" and int(x[5].rsplit(":", 1)[1]) == inode}


def test_partitions_on_one_host_take_turns():
    """Every partition uses the same host addresses, so a second (another devnet, another test
    worker) waits for the first to be torn down."""
    with Partition():
        assert os.getpid() in _holders()
        held = subprocess.run([sys.executable, "-c", TRY_LOCK], capture_output=True, text=True)
        assert held.returncode != 0 and "BlockingIOError" in held.stderr
    # released (another test worker's partition may hold it now: only ours must be gone)
    assert os.getpid() not in _holders()
