"""The shapes of the local API's answers, checked before the CLI renders them.

A daemon of another version, or anything else listening on the API's port, may answer with JSON
of another shape; the CLI must then say so in one line instead of failing somewhere inside a
renderer. Each shape lists the keys a command reads and their JSON types (nested: a dict for an
object, a one-element list for a list of that shape, a tuple for alternatives). Extra keys are
allowed: an answer may carry more than the command shows.
"""

from __future__ import annotations

from typing import Any

from open1b.protocol import Open1bError


class MalformedAnswer(Open1bError):
    """The node API answered, but not with what the command asked for."""


Shape = Any  # type | tuple of types | list[Shape] (one element) | dict[str, Shape]

PEER_ID, HEX, COUNT = str, str, int
MAYBE_INT = (int, type(None))

STATUS = {"peer_id": PEER_ID, "addrs": [str], "peers": [PEER_ID], "peers_banned": COUNT, "runs": [HEX],
          "attestations_stored": COUNT, "replays": COUNT, "replay_failures": COUNT, "claims_won": COUNT,
          "claims_lost": COUNT, "gossip_rejected": COUNT, "gossip_ignored": COUNT, "synced": COUNT, "audit": bool,
          "replaying_step": MAYBE_INT,
          "device": {"requested": str, "class": (str, type(None)), "reason": str},
          "reachability": {"state": str, "reason": str}}
PEERS = [{"peer_id": PEER_ID, "addrs": [str], "rejected": COUNT}]
RUNS = [{"run": HEX, "steps": COUNT, "engine": str, "run_dir": (str, type(None))}]
COVERAGE = {"run": HEX, "steps": COUNT, "redundancy": COUNT, "verified_steps": COUNT, "disputed_steps": [int],
            "refuted_steps": [int], "claimed_steps": COUNT, "unaudited_steps": COUNT, "complete": bool,
            "policy": {"name": str, "roots": [PEER_ID], "earned": [PEER_ID], "quorum": COUNT},
            "flagged": [{"signer": PEER_ID, "step": int, "kind": str, "statement": HEX, "conflicting": HEX,
                         "reveal": (HEX, type(None))}],
            "untrusted": [PEER_ID],
            "per_step": [{"step": int, "status": str, "auditors": [PEER_ID], "dissenters": [PEER_ID],
                          "claimants": [PEER_ID], "devices": [str]}]}
LEADERBOARD = [{"run": HEX, "eval_set": HEX, "rank": MAYBE_INT, "loss": (float, type(None)), "eval_state": MAYBE_INT,
                "evaluations": {"certified": COUNT, "disputed": COUNT, "unchecked": COUNT}, "replayed": (float, int),
                "disputed_steps": COUNT, "devices": [str], "reason": str}]
CLAIMS = [{"run": HEX, "step": int, "slot": int, "claimant": PEER_ID, "expires_in_s": int}]
ATTESTATIONS = [{"step": int, "verdict": str, "signer": PEER_ID, "engine": str, "hardware": str, "elapsed_ms": int,
                 "encoded": HEX}]
PUBLICATION = {"run": HEX, "steps": COUNT, "dir": str, "state": str, "done": COUNT, "note": str, "bytes": COUNT,
               "provided": COUNT, "gossiped": bool, "moved": bool, "error": (str, type(None)), "seconds": (int, float, type(None))}
FETCHED = {"run_dir": str}
RELEASED = {"released": bool}
REVEAL = {"step": int, "witness": HEX, "digest": HEX}


def checked(value: Any, shape: Shape, where: str = "answer") -> Any:
    """``value`` if it has ``shape``; else :class:`MalformedAnswer` naming the first difference."""
    if isinstance(shape, dict):
        if type(value) is not dict:
            raise MalformedAnswer(f"malformed answer from the node API: {where} is not an object")
        for key, inner in shape.items():
            if key not in value:
                raise MalformedAnswer(f"malformed answer from the node API: {where} has no {key!r}")
            checked(value[key], inner, f"{where}.{key}")
    elif isinstance(shape, list):
        if type(value) is not list:
            raise MalformedAnswer(f"malformed answer from the node API: {where} is not a list")
        for i, item in enumerate(value):
            checked(item, shape[0], f"{where}[{i}]")
    else:
        kinds = shape if isinstance(shape, tuple) else (shape,)
        # bool is an int in Python, not in JSON: a count must not be true or false
        if not any(type(value) is kind or (kind is float and type(value) is int) for kind in kinds):
            expected = " or ".join(k.__name__ for k in kinds)
            raise MalformedAnswer(f"malformed answer from the node API: {where} is not a {expected}")
    return value
