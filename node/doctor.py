"""``open1b-node doctor``: can this machine audit, and is its node healthy? Each check says
OK, WARN or FAIL with a reason, like the incumbent's client; any FAIL makes the exit code 1 —
except a GPU that fails its self-checks: the node then replays on the CPU, which gives the same
bits, so that FAIL makes the overall verdict WARN."""

from __future__ import annotations

import os
import platform
import shutil
import socket
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .config import ConfigError, load_config
from .identity_file import key_path

MIN_FREE_DISK_GB = 2.0
MIN_MEMORY_GB = 1.0


@dataclass(frozen=True)
class Check:
    name: str
    level: str  # OK | WARN | FAIL
    detail: str

    def as_json(self) -> dict:
        return {"check": self.name, "level": self.level, "detail": self.detail}


def _memory_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


GPU_CHECK = "gpu"


def _gpu(spec: str) -> list[Check]:
    """One line per CUDA device, each self-checked on the device itself (the probes run by its own
    kernels, and the known-answer step, whose hash must be the CPU's pinned one)."""
    from open1b.deterministic.device import cuda_device_count, probe_cuda_device
    from open1b.deterministic.device_spec import parse_device_spec

    kind, index = parse_device_spec(spec)
    if kind == "cpu":
        return [Check(GPU_CHECK, "OK", "not used (device cpu)")]
    count, why_none = cuda_device_count()
    if count == 0:
        level = "WARN" if kind == "cuda" else "OK"
        return [Check(GPU_CHECK, level, f"{why_none}: this node replays on the CPU (device {spec})")]
    checks = []
    for i in range(count) if index is None else [index]:
        if i >= count:
            checks.append(Check(GPU_CHECK, "WARN", f"cuda:{i} is not here ({count} device(s)): replays on the CPU"))
            continue
        probe = probe_cuda_device(i)
        if probe.ok:
            checks.append(Check(GPU_CHECK, "OK", f"cuda:{i} ({probe.device_class}) passed the self-checks: "
                                + ", ".join(c.name for c in probe.checks)))
        else:
            checks.append(Check(GPU_CHECK, "FAIL", f"cuda:{i} ({probe.device_class}) is refused, it would compute "
                                f"other bits ({probe.failures()}); the node replays on the CPU instead"))
    return checks


def overall(checks: list[Check]) -> str:
    """FAIL if anything but a GPU fails (a refused GPU leaves the CPU, with the same bits: WARN)."""
    if any(c.level == "FAIL" and c.name != GPU_CHECK for c in checks):
        return "FAIL"
    return "WARN" if any(c.level != "OK" for c in checks) else "OK"


def _tcp_reachable(addr: str) -> bool:
    parts = addr.split("/")
    try:
        host, port = parts[parts.index("ip4") + 1], int(parts[parts.index("tcp") + 1])
        with socket.create_connection((host, port), timeout=2):
            return True
    except (ValueError, OSError):
        return False


def _disk(data_dir: Path) -> list[Check]:
    """Free space (against the config's reserve) and writability of the data dir: a read-only or
    full disk is a FAIL, found here rather than by the daemon half-way through an import."""
    if os.path.lexists(data_dir) and not data_dir.is_dir():
        return [Check("disk", "FAIL", f"data dir {data_dir} is not a directory")]
    probe = data_dir if data_dir.is_dir() else data_dir.parent
    if not probe.is_dir():
        return [Check("disk", "FAIL", f"{data_dir}: neither it nor its parent is a directory")]
    try:
        reserve = load_config(data_dir).disk_reserve_bytes if data_dir.is_dir() else 0
    except ConfigError:
        reserve = 0  # reported by the config check
    free = shutil.disk_usage(probe).free
    need = max(MIN_FREE_DISK_GB * 2**30, reserve)
    why = ("the reserve, disk_reserve_bytes" if reserve > MIN_FREE_DISK_GB * 2**30
           else "the doctor's minimum for a node, whatever disk_reserve_bytes says")
    checks = [Check("disk", "OK" if free >= need else "FAIL",
                    f"{free / 2**30:.1f} GiB free at {probe} (needs {need / 2**30:.1f} GiB: {why})")]
    target = probe / f".doctor-probe.{os.getpid()}"
    try:
        target.write_bytes(b"probe")
        target.unlink()
        checks.append(Check("writable", "OK", f"{probe} is writable"))
    except OSError as exc:
        checks.append(Check("writable", "FAIL", f"{probe} is not writable: {exc.strerror}"))
    return checks


def _trust(coverage: dict) -> Check:
    """Why a run's coverage may not complete: attesters this node's policy does not count (yet:
    a key counts once it earns trust, docs/protocol.md §8.1.1)."""
    untrusted = coverage["untrusted"]
    run = coverage["run"][:16]
    earned = len(coverage["policy"]["earned"])
    counted = f"{len(coverage['policy']['roots']) - earned} listed and {earned} earned keys counted"
    if not untrusted:
        return Check("trust", "OK", f"run {run}: every attester is counted ({counted})")
    shown = " ".join(untrusted[:3]) + (" …" if len(untrusted) > 3 else "")
    return Check("trust", "WARN", f"run {run}: {counted}; {len(untrusted)} untrusted attesters not counted until "
                                  f"they earn trust (open1b-node trust list); if you run or know them: "
                                  f"open1b-node trust add {shown} (then restart)")


def run_checks(data_dir: Path, api_status: dict | None, device: str | None = None,
               coverages: Sequence[dict] = ()) -> list[Check]:
    """Every check; ``device`` is what to check the GPU lines against (default: the config's);
    ``coverages``: the running daemon's coverage of its runs, whose untrusted attesters are explained."""
    checks = [
        Check("python", "OK" if sys.version_info >= (3, 11) else "FAIL", platform.python_version()),
        Check("cpu", "OK", f"{platform.machine()}, {os.cpu_count()} cores, {platform.processor() or platform.system()}"),
    ]
    if device is None:
        try:
            device = load_config(data_dir).device
        except ConfigError:
            device = "auto"  # the config line below says what is wrong with it
    checks += _gpu(device)
    mem = _memory_gb()
    if mem is None:
        checks.append(Check("memory", "WARN", "cannot read /proc/meminfo"))
    else:
        checks.append(Check("memory", "OK" if mem >= MIN_MEMORY_GB else "FAIL", f"{mem:.1f} GiB available"))
    checks += _disk(data_dir)
    try:
        from open1b.deterministic.selfcheck import run_selfchecks

        for result in run_selfchecks():
            checks.append(Check(f"determinism: {result.name}", "OK" if result.ok else "FAIL", result.detail))
    except Exception as exc:  # a broken numeric stack is exactly what doctor must report
        checks.append(Check("determinism", "FAIL", f"self-checks could not run: {exc}"))
    key = key_path(data_dir)
    if not key.exists():
        checks.append(Check("data dir", "WARN", f"{data_dir} is not initialised (run `open1b-node init`)"))
    else:
        mode = stat.S_IMODE(key.stat().st_mode)
        checks.append(Check("key file", "OK" if mode & 0o077 == 0 else "FAIL", f"{key} mode {mode:04o}"))
        try:
            config = load_config(data_dir)
            checks.append(Check("config", "OK", f"{data_dir / 'config.toml'} parses"))
            for addr in config.bootstrap:
                ok = _tcp_reachable(addr)
                checks.append(Check("bootstrap peer", "OK" if ok else "WARN", f"{addr} {'reachable' if ok else 'unreachable'}"))
        except ConfigError as exc:
            checks.append(Check("config", "FAIL", str(exc)))
    if api_status is None:
        checks.append(Check("daemon", "WARN", "no running daemon answered on its API"))
    else:
        n = len(api_status["peers"])
        checks.append(Check("daemon", "OK", f"running as {api_status['peer_id']}"))
        d = api_status["device"]
        checks.append(Check("replay device", "OK", f"{d['class']}: {d['reason']}" if d["class"]
                            else f"{d['requested']} (the replay worker has not started yet)"))
        checks.append(Check("peers", "OK" if n else "WARN", f"{n} connected"))
        r = api_status["reachability"]
        checks.append(Check("reachability", "OK" if r["state"] == "public" else "WARN", f"{r['state']}: {r['reason']}"))
    checks += [_trust(c) for c in coverages]
    return checks
