"""``open1b-node dispute verify PROOF [--json]``: judge a fraud proof offline (docs/protocol.md §18.4).

The referee (:func:`open1b.protocol.dispute.verify_fraud_proof`, numpy for the re-execution) names
the party whose output of one op is wrong. The exit status is examples/verify_fraud_proof.py's:
0 when the proof convicts someone, 2 when it is refused (it breaks a rule: its reason code says
which), 3 when this referee cannot judge it (an op kind it does not re-execute); 1 is an error (a
file that cannot be read).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from open1b.protocol import Open1bError
from open1b.protocol.dispute import MAX_FRAUD_PROOF_SIZE, verify_fraud_proof
from open1b.protocol.hashing import blake2b256

from .files import FileRefused, read_bounded
from .results import CommandResult

EXIT_STATUS = {"accept": 0, "reject": 2, "ignore": 3}
"""A verdict's outcome → the exit status (examples/verify_fraud_proof.py's)."""


def read_proof(path: Path, *, follow: bool = False) -> bytes:
    """``path``'s bytes, refused beyond ``MAX_FRAUD_PROOF_SIZE`` before a byte is read; a link is
    followed only when asked, and a FIFO or device is refused instead of blocking."""
    try:
        return read_bounded(path, MAX_FRAUD_PROOF_SIZE, follow=follow)
    except FileRefused as exc:
        raise Open1bError(f"cannot read the proof {exc}") from None


def verdict_result(data: bytes) -> CommandResult:
    """The referee's verdict on the encoded proof ``data``, with the proof's digest (B2 of its
    bytes: how the proof is named where it is cited)."""
    verdict = verify_fraud_proof(data)
    out = {**verdict.to_json(), "proof": blake2b256(data).hex(), "bytes": len(data)}
    return CommandResult(out, _render, EXIT_STATUS[verdict.outcome.value])


def _render(o: dict) -> str:
    if o["outcome"] == "accept":
        return (f"GUILTY {', '.join(o['guilty'])}\n  run {o['run']} step {o['step']}, op {o['position']} "
                f"({o['op']}): {o['code']} ({o['reason']})\n  proof {o['proof']} ({o['bytes']} bytes)")
    what = "REFUSED" if o["outcome"] == "reject" else "CANNOT JUDGE"
    return f"{what} {o['code']}: {o['reason']} (proof {o['proof']}, {o['bytes']} bytes)"


def cmd_dispute_verify(args: argparse.Namespace) -> CommandResult:
    return verdict_result(read_proof(Path(args.proof), follow=args.follow))


def add_parser(sub, parents: list) -> None:
    """Register ``dispute`` on the CLI's subparsers (``parents`` give --json)."""
    d = sub.add_parser("dispute", help="fraud proofs (docs/protocol.md §18)")
    dsub = d.add_subparsers(dest="dispute_command", required=True)
    v = dsub.add_parser("verify", parents=parents,
                        help="judge a fraud proof offline: exit 0 if it convicts someone, 2 if it is refused, "
                             "3 if it cannot be judged here")
    v.add_argument("proof", metavar="PROOF", help="a file holding one encoded fraud proof")
    v.add_argument("--follow", action="store_true", help="follow PROOF if it is a symbolic link")
    v.set_defaults(func=cmd_dispute_verify)
