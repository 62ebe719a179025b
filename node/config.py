"""Node configuration: ``<data_dir>/config.toml``, read once at start, strictly.

Unknown keys and wrong types are errors with the offending key in the message — a typo in a
config file must not silently fall back to a default. The file is written atomically (temp file,
fsync, rename) with mode 0600.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multiaddr import Multiaddr

from open1b.deterministic.device_spec import parse_device_spec
from open1b.deterministic.errors import DeviceSpecError
from open1b.protocol import Open1bError, TrustPolicy, public_key_from_peer_id
from open1b.protocol.claims import MAX_LEASE_SECONDS
from open1b.protocol.coverage import ALLOWLIST, OPEN
from open1b.protocol.dispute.bisection import ROUND_TIMEOUT_S
from open1b.protocol.spotcheck import ANSWER_SECONDS

from .files import FileRefused, read_bounded, write_atomic

CONFIG_FILE = "config.toml"
MAX_CONFIG_BYTES = 1 << 20
MAX_SPOT_CHECKS_IN_FLIGHT = 8  # each holds two checkpoints in its own working directory
MIN_SYNC_INTERVAL_S = 1.0  # peers refuse to serve one peer's syncs more often (node/sync.py)


class ConfigError(Open1bError):
    """The configuration file or a command-line setting is invalid."""


def split_hostport(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def is_loopback(host: str) -> bool:
    """``host`` (a name or an address, IPv6 with or without brackets) is this machine's loopback."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _check_peer_addr(addr: str) -> None:
    """A bootstrap address the daemon can dial: a multiaddr with a TCP port and a valid peer ID
    (refused at start, from the command line or config.toml alike, not retried forever)."""
    try:
        parsed = Multiaddr(addr)
        parsed.value_for_protocol("tcp")
        peer = parsed.value_for_protocol("p2p")
    except Exception as exc:  # multiaddr raises a zoo of types for malformed input
        raise ConfigError(f"bootstrap address {addr!r} is not /ip4/HOST/tcp/PORT/p2p/PEER_ID: {exc}") from None
    try:
        public_key_from_peer_id(peer)
    except Open1bError as exc:
        raise ConfigError(f"bootstrap address {addr!r}: {exc}") from None


@dataclass(frozen=True)
class NodeConfig:
    """Everything a daemon needs; ``data_dir`` is where it lives, the rest is config.toml."""

    data_dir: Path
    listen: str = "0.0.0.0:4701"
    api: str = "127.0.0.1:5701"
    metrics: str = ""  # HOST:PORT to serve Prometheus metrics on; empty = off
    # Web origins (``http://host:port``) allowed to call the API from a browser, with CORS
    # headers; empty = only the API's own page (docs/api.md).
    api_origins: tuple[str, ...] = ()
    bootstrap: tuple[str, ...] = ()
    run_dirs: tuple[Path, ...] = ()
    audit: bool = True
    redundancy: int = 2
    lease_s: int = 120
    replay_timeout_s: float = 3600.0
    # How long a spot check waits for the trainer's answer to its challenge before it signs
    # fail/no_answer (docs/protocol.md §5.5); the spec's ANSWER_SECONDS, shorter only in tests and devnets.
    answer_s: float = ANSWER_SECONDS
    # Whether an auditing node also spot checks runs with fingerprints (docs/protocol.md §5.5),
    # beside its replays. A spot check costs it about 1 / (ranks × micro_batches) of a
    # replay, and its answer costs the publisher up to a step.
    spot_checks: bool = True
    # Spot checks a node runs at once while some step of a run has none; after that first sweep,
    # one. Most of a spot check can be waiting (two checkpoint fetches, the publisher's answer), so
    # more lanes give the first sweep a larger share of the worker. On `tiny` two lanes did 10% more
    # spot checks but flagged no sooner within the noise of a draw (docs/benchmarks.md), so the
    # default keeps one.
    spot_checks_in_flight: int = 1
    # Where the replay worker computes: auto (a CUDA device that passes the self-checks, else the
    # CPU), cpu, cuda or cuda:N. A GPU that is missing or fails a check falls back to the CPU.
    device: str = "auto"
    # Whether this node relays control traffic (circuit relay v2, node/relays.py) for nodes behind
    # NAT, within fixed limits, while its reachability is public; never checkpoints.
    relay_service: bool = True
    # Whether this node opens and answers disputes (docs/protocol.md §18.5): a dispute costs a traced
    # replay of the step on each side. How long a party may take to answer one exchange of one
    # (the spec's ROUND_TIMEOUT_S; shorter only in tests and devnets).
    disputes: bool = True
    dispute_round_s: float = ROUND_TIMEOUT_S
    sync_interval_s: float = 2.0
    idle_poll_s: float = 0.5
    heartbeat_s: float = 1.0
    max_rejects_per_peer: int = 20
    # Bound on the blob cache (checkpoints and samples fetched from peers); blobs this node
    # publishes are pinned and never evicted, so they may take it over the bound.
    blob_cache_bytes: int = 8 << 30
    # Free space kept on the data dir's filesystem: imports and fetches that would eat into it
    # fail at once (before a byte is written) instead of filling the disk under SQLite.
    disk_reserve_bytes: int = 256 << 20
    # Whose attestations count (docs/protocol.md §8.1): by default only this node's own key and
    # the peers the operator lists, so keys nobody vouched for can neither inflate coverage nor
    # make the node skip steps they claim to have covered.
    trust_policy: str = ALLOWLIST
    trusted_peers: tuple[str, ...] = ()
    # Earned trust (docs/protocol.md §8.1.1): under the allowlist, a key also counts once it has
    # proven ``earn_trust_matches`` replays on steps this node's listed keys replayed too, spanning
    # ``earn_trust_publishers`` publishers unless one run is a listed key's. Off = the list alone.
    earn_trust: bool = True
    earn_trust_matches: int = 3
    earn_trust_publishers: int = 2
    # Whether the planner counts attesters the policy does not (coverage never does). Off by
    # default: on, a step that keys outside the list have covered is not replayed again by every
    # node, but fresh keys can then withhold this node's replays — the devnet's sybil scenario
    # showed honest coverage never completing — so an operator turns it on knowingly.
    plan_with_untrusted: bool = False
    dispute_quorum: int = 2
    # Whose runs this node learns from the network and audits: empty = any publisher. A run costs
    # compute and bandwidth, and anyone can sign a manifest; runs the operator publishes or names
    # with ``--run`` are always taken.
    publishers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for field, (low, high) in _RANGES.items():  # `not low <= v <= high`: also refuses nan
            value = getattr(self, field)
            if not low <= value <= high or (field in _ABOVE_LOW and value == low):
                shown = f"({low}, {high}]" if field in _ABOVE_LOW else f"[{low}, {high}]"
                raise ConfigError(f"{_KEY_OF.get(field, field)} must be in {shown}, got {value!r}")
        split_hostport(self.listen)
        split_hostport(self.api)
        if self.metrics:
            split_hostport(self.metrics)
        for origin in self.api_origins:
            scheme, _, rest = origin.partition("://")
            if scheme not in ("http", "https") or not rest or "/" in rest.rstrip("/"):
                raise ConfigError(f"api_origins: expected http(s)://HOST[:PORT], got {origin!r}")
        try:
            parse_device_spec(self.device)
        except DeviceSpecError as exc:
            raise ConfigError(str(exc)) from None
        for addr in self.bootstrap:
            _check_peer_addr(addr)
        if self.trust_policy not in (OPEN, ALLOWLIST):
            raise ConfigError(f"trust_policy must be {OPEN!r} or {ALLOWLIST!r}")
        if self.dispute_quorum != 0 and self.dispute_quorum < 2:
            raise ConfigError("dispute_quorum must be 0 (off) or at least 2")
        for what, peers in (("trusted peer", self.trusted_peers), ("publisher", self.publishers)):
            for peer in peers:
                try:
                    public_key_from_peer_id(peer)
                except Open1bError as exc:
                    raise ConfigError(f"{what} {peer!r}: {exc}") from None

    def trust(self, own_key: bytes) -> TrustPolicy:
        """The listed policy: its own key is always a root (earned keys are added by node/judge.py)."""
        roots = frozenset({own_key, *(public_key_from_peer_id(p) for p in self.trusted_peers)})
        return TrustPolicy(self.trust_policy, roots, self.dispute_quorum)

    def with_overrides(self, **changes: Any) -> NodeConfig:
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})


_BYTES = 1 << 62
_DAY_S = 86400.0
# field -> the inclusive range of its values (a field in _ABOVE_LOW may not equal its low end)
_RANGES: dict[str, tuple[float, float]] = {
    "redundancy": (1, 256),  # a claim's slot is at most 255
    "lease_s": (1, MAX_LEASE_SECONDS),
    "replay_timeout_s": (0, 7 * _DAY_S),
    "answer_s": (0, ANSWER_SECONDS),  # a verifier may not wait longer than the spec
    "dispute_round_s": (0, ROUND_TIMEOUT_S),  # nor a disputing party
    "spot_checks_in_flight": (1, MAX_SPOT_CHECKS_IN_FLIGHT),
    "sync_interval_s": (MIN_SYNC_INTERVAL_S, _DAY_S),
    "idle_poll_s": (0, 3600.0),
    "heartbeat_s": (0, 3600.0),
    "max_rejects_per_peer": (1, 1 << 20),
    "blob_cache_bytes": (0, _BYTES),
    "disk_reserve_bytes": (0, _BYTES),
    "earn_trust_matches": (1, 1 << 20),
    "earn_trust_publishers": (1, 1 << 20),
    "dispute_quorum": (0, 1 << 20),
}
_ABOVE_LOW = frozenset({"replay_timeout_s", "answer_s", "dispute_round_s", "idle_poll_s", "heartbeat_s"})


# config.toml key -> (field, type)
_KEYS: dict[str, tuple[str, type]] = {
    "listen": ("listen", str), "api": ("api", str), "metrics": ("metrics", str), "bootstrap": ("bootstrap", list),
    "runs": ("run_dirs", list), "audit": ("audit", bool), "redundancy": ("redundancy", int),
    "lease_seconds": ("lease_s", int), "replay_timeout_seconds": ("replay_timeout_s", float),
    "answer_seconds": ("answer_s", float), "spot_checks": ("spot_checks", bool),
    "spot_checks_in_flight": ("spot_checks_in_flight", int),
    "sync_interval_seconds": ("sync_interval_s", float), "max_rejects_per_peer": ("max_rejects_per_peer", int),
    "trust_policy": ("trust_policy", str), "trusted_peers": ("trusted_peers", list),
    "earn_trust": ("earn_trust", bool), "earn_trust_matches": ("earn_trust_matches", int),
    "earn_trust_publishers": ("earn_trust_publishers", int),
    "plan_with_untrusted": ("plan_with_untrusted", bool),
    "dispute_quorum": ("dispute_quorum", int), "blob_cache_bytes": ("blob_cache_bytes", int),
    "disk_reserve_bytes": ("disk_reserve_bytes", int),
    "publishers": ("publishers", list), "device": ("device", str), "api_origins": ("api_origins", list),
    "relay_service": ("relay_service", bool), "disputes": ("disputes", bool),
    "dispute_round_seconds": ("dispute_round_s", float),
}


_KEY_OF = {field: f"node.{key}" for key, (field, _) in _KEYS.items()}

_KIND_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false", list: "a list"}


def load_config(data_dir: Path) -> NodeConfig:
    """Read ``config.toml`` (missing file = defaults)."""
    path = Path(data_dir) / CONFIG_FILE
    try:
        raw = tomllib.loads(read_bounded(path, MAX_CONFIG_BYTES, follow=True).decode()) if path.exists() else {}
    except FileRefused as exc:
        raise ConfigError(str(exc)) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    section = raw.pop("node", {})
    if type(section) is not dict:
        raise ConfigError(f"{path}: node must be a table ([node])")
    if raw:
        raise ConfigError(f"{path}: unknown section(s) {sorted(raw)}; everything lives under [node]")
    values: dict[str, Any] = {}
    for key, value in section.items():
        if key not in _KEYS:
            raise ConfigError(f"{path}: unknown key node.{key}")
        field, kind = _KEYS[key]
        if kind is float and type(value) is int:
            value = float(value)
        if type(value) is not kind:
            raise ConfigError(f"{path}: node.{key} must be {_KIND_NAMES[kind]}")
        if kind is list:
            if not all(type(v) is str for v in value):
                raise ConfigError(f"{path}: node.{key} must be a list of strings")
            value = tuple(Path(v) for v in value) if field == "run_dirs" else tuple(value)
        values[field] = value
    try:
        return NodeConfig(data_dir=Path(data_dir), **values)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def render_config(config: NodeConfig) -> str:
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, tuple):
            return "[" + ", ".join(value(str(x)) for x in v) + "]"
        return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'

    lines = ["# open1b-node configuration; read once when the daemon starts.", "[node]"]
    for key, (field, _) in _KEYS.items():
        lines.append(f"{key} = {value(getattr(config, field))}")
    return "\n".join(lines) + "\n"


def write_config(config: NodeConfig) -> Path:
    path = config.data_dir / CONFIG_FILE
    write_atomic(path, render_config(config).encode(), mode=0o600)
    return path
