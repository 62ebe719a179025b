"""``open1b-node verify-handoff``: check an Open-1B hand-off against the run's published v3 hash.

The hash itself is :mod:`open1b.protocol.gensyn_handoff` (pure, hashlib only); this module reads the
hand-off directory (memory-mapped, so multi-GB tensors are hashed without being copied), finds
the expected and previous hashes, and builds the typed result the CLI renders.

Hand-off directory (docs/protocol.md, "Open-1B hand-offs"):

    meta.json                   {"step", "dp_world_size", "dp_shard", "param_groups"}
    model.safetensors           weight n
    optimizer.safetensors       n.exp_avg, n.exp_avg_sq, n.step   (absent: no optimizer state)
    gradients.safetensors       gradient n                         (absent: grad_none)
    batch_hasher.rank_<r>.bin   rank r's final batch chain, 32 raw bytes, r = 0 … dp_world_size-1

The expected hash is ``--expected`` or the log's entry for the hand-off's step; the previous
hash is ``--prev`` or the log's entry for the last hashed step before it (32 zero bytes for
step 1, a cold start). A ``state_hash.txt`` in the hand-off is its author's claim and is never
read.
"""

from __future__ import annotations

import json
import mmap
import os
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

from open1b.protocol import Open1bError
from open1b.protocol.gensyn_handoff import HandoffMeta, handoff_state_hash
from open1b.protocol.trajectory import MAX_TRAJECTORY_SIZE, parse_state_hash_log

from .files import FileRefused, open_regular, read_bounded
from .results import CommandResult

MAX_WORLD = 4096
MAX_META_SIZE = 1 << 20
MAX_MAPPED_FILE = 1 << 40  # mapped, never read whole: a bound only against the absurd
# What an absent optimizer.safetensors or gradients.safetensors reads as: a file with no tensors
# (docs/protocol.md §14.2: absent means no optimizer state, or grad_none, for every weight).
EMPTY_SAFETENSORS = (2).to_bytes(8, "little") + b"{}"


class HandoffError(Open1bError):
    """The hand-off or the hashes to compare it with are missing or unreadable."""


@dataclass(frozen=True)
class HandoffResult:
    handoff: str
    step: int
    dp_world_size: int
    dp_shard: int
    prev_hash: str
    expected_hash: str
    reconstructed_hash: str
    verified: bool


def _hex32(text: str, what: str) -> bytes:
    try:
        value = bytes.fromhex(text.strip())
    except ValueError:
        value = b""
    if len(value) != 32:
        raise HandoffError(f"{what} must be 64 hex digits")
    return value


def _hashes(meta: HandoffMeta, expected: str | None, prev: str | None, log_path: Path | None) -> tuple[bytes, bytes]:
    log: dict[int, bytes] = {}
    if log_path is not None:
        log = parse_state_hash_log(_read_bounded(log_path, MAX_TRAJECTORY_SIZE))
    if expected is None and meta.step not in log:
        raise HandoffError(f"no expected hash: pass --expected, or a --state-hashes log with step {meta.step}")
    want = _hex32(expected, "--expected") if expected is not None else log[meta.step]
    if prev is not None:
        return want, _hex32(prev, "--prev")
    earlier = [s for s in log if 0 < s < meta.step]
    if earlier:
        return want, log[max(earlier)]
    if meta.step == 1:
        return want, bytes(32)
    raise HandoffError(f"no previous hash: pass --prev, or a --state-hashes log with a step before {meta.step}")


def _read_bounded(path: Path, limit: int) -> bytes:
    """``path``'s bytes: a regular file (a FIFO is refused, not waited on) of at most ``limit``."""
    try:
        return read_bounded(path, limit, follow=True)
    except FileRefused as exc:
        raise HandoffError(str(exc)) from None


def _read_meta(root: Path) -> HandoffMeta:
    path = root / "meta.json"
    data = _read_bounded(path, MAX_META_SIZE)
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as exc:  # deep nesting raises RecursionError, not ValueError
        raise HandoffError(f"{path} is not JSON: {exc}") from None
    try:
        return HandoffMeta.from_json(value)
    except Open1bError as exc:
        raise HandoffError(f"{path}: {exc}") from None


def verify_handoff(root: Path, *, expected: str | None = None, prev: str | None = None,
                   state_hashes: Path | None = None) -> HandoffResult:
    root = Path(root)
    meta = _read_meta(root)
    if meta.dp_world_size > MAX_WORLD:
        raise HandoffError(f"dp_world_size {meta.dp_world_size} exceeds {MAX_WORLD}")
    want, before = _hashes(meta, expected, prev, state_hashes)
    failure: str | None = None
    with ExitStack() as stack:
        def mapped(name: str, *, optional: bool = False) -> memoryview:
            path = root / name
            if not os.path.lexists(path):
                if optional:
                    return memoryview(EMPTY_SAFETENSORS)
                raise HandoffError(f"the hand-off has no {name}")
            try:
                fd, _ = open_regular(path, MAX_MAPPED_FILE, follow=True)
            except FileRefused as exc:
                raise HandoffError(str(exc)) from None
            f = stack.enter_context(os.fdopen(fd, "rb"))
            if os.fstat(f.fileno()).st_size == 0:
                return memoryview(b"")
            m = stack.enter_context(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
            view = memoryview(m)
            stack.callback(view.release)
            return view

        chains = [bytes(mapped(f"batch_hasher.rank_{r}.bin")) for r in range(meta.dp_world_size)]
        try:
            got = handoff_state_hash(meta, before, mapped("model.safetensors"),
                                     mapped("optimizer.safetensors", optional=True),
                                     mapped("gradients.safetensors", optional=True), chains)
        except Open1bError as exc:
            # Kept as text: the exception's traceback holds views into the mapped files, and a map
            # with live views cannot close (BufferError) — the error must be gone before the maps go.
            failure = str(exc)
    if failure is not None:
        raise HandoffError(f"{root}: {failure}")
    return HandoffResult(str(root), meta.step, meta.dp_world_size, meta.dp_shard, before.hex(), want.hex(),
                         got.hex(), got == want)


def result_json(result: HandoffResult) -> dict:
    return asdict(result)


def render(result: dict) -> str:
    verdict = "MATCH" if result["verified"] else "MISMATCH"
    return "\n".join([
        f"hand-off       {result['handoff']} (step {result['step']}, {result['dp_world_size']} ranks,"
        f" {result['dp_shard']} shards)",
        f"previous       {result['prev_hash']}",
        f"reconstructed  {result['reconstructed_hash']}",
        f"expected       {result['expected_hash']}",
        f"verdict        {verdict}",
    ])


def cmd_verify_handoff(args) -> CommandResult:
    result = result_json(verify_handoff(Path(args.handoff), expected=args.expected, prev=args.prev,
                                        state_hashes=Path(args.state_hashes) if args.state_hashes else None))
    return CommandResult(result, render, 0 if result["verified"] else 2)


def add_parser(sub, parents: list) -> None:
    """Register ``verify-handoff`` on the CLI's subparsers (``parents`` give --json)."""
    v = sub.add_parser("verify-handoff", parents=parents,
                       help="recompute an Open-1B hand-off's v3 state hash: match (0) or mismatch (2)")
    v.add_argument("handoff", help="hand-off directory (meta.json, *.safetensors, batch_hasher.rank_<r>.bin)")
    v.add_argument("--expected", help="the published hash of the hand-off's step (64 hex digits)")
    v.add_argument("--state-hashes", help="the run's state_hashes.jsonl: the expected and previous hashes")
    v.add_argument("--prev", help="the previous hashed step's hash (default: from --state-hashes)")
    v.set_defaults(func=cmd_verify_handoff)
