"""``open1b-node data RUN (--include | --exclude) [FILE] [--text T]``: did the run train on this
document? One verified proof about its exact bytes (docs/run-format.md §8.6).

``--include`` and ``--exclude`` print the same answer for the same document — included, never
drawn or absent — and differ only in the exit status: 0 when the answer is what was asked, 3 when
it is the other one (1 is an error). The proof is built by :mod:`open1b.deterministic.document_proofs`
and checked with the protocol's verifier, completeness included, before it is printed.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Callable

from open1b.protocol import Open1bError

from .files import FileRefused, read_bounded
from .results import CommandResult

MAX_DOCUMENT_BYTES = 1 << 26
"""A document file larger than this (64 MiB) is refused before it is read."""
EXIT_OTHER_ANSWER = 3


def read_document(path: Path) -> bytes:
    """``path``'s bytes, refused beyond :data:`MAX_DOCUMENT_BYTES` before it is read; a link is
    not followed (the caller named a file, not what it points to), and a FIFO or device is refused
    instead of blocking (:func:`~.files.read_bounded`)."""
    try:
        return read_bounded(path, MAX_DOCUMENT_BYTES)
    except FileRefused as exc:
        raise Open1bError(f"cannot read {exc}") from None


def data_answer(run: Path, document: bytes, *, exclude: bool) -> tuple[dict, Callable[[Any], str], int]:
    """The command's result: its JSON, how to render it for a person, and its exit status."""
    from open1b.deterministic.document_proofs import prove_document  # the engine: only this command needs it

    answer = prove_document(run, document)
    asked = (not answer.used) if exclude else answer.used
    return answer.to_json(), _render, 0 if asked else EXIT_OTHER_ANSWER


def _render(o: dict) -> str:
    head = f"run {o['run']}\ndocument {o['document']} ({o['size']} bytes, exact bytes, not normalised)\n"
    proof = o["proof"]
    if o["answer"] == "absent":
        sides = [f"{side} neighbour: leaf {n['index']} {n['digest']}" for side in ("lower", "upper")
                 if (n := proof[side]) is not None]
        return head + "NOT IN THE CORPUS: its digest lies between two adjacent leaves of document_set_root\n  " \
            + "\n  ".join(sides)
    entry = proof["entry"]
    where = f"document {entry['index']}, tokens [{entry['start']}, {entry['end']})"
    if o["answer"] == "never_drawn":
        return head + f"IN THE CORPUS ({where}), NEVER DRAWN: no step drew a sample holding it (re-derived)"
    lines = [head + f"USED ({where}): {o['draws']} rows in {o['steps']} steps, every draw re-derived",
             "STEP      RANK  MICRO  ROW  SAMPLE"]
    lines += [f"{k:<9} {r:<5} {m:<6} {j:<4} {s}" for k, r, m, j, s in proof["draws"]]
    return "\n".join(lines)


def cmd_data(args: argparse.Namespace) -> CommandResult:
    file = args.include if args.include is not None else args.exclude
    if bool(file) == (args.text is not None):
        raise ValueError("name the document by a FILE after --include/--exclude, or by --text T (one of them)")
    document = args.text.encode("utf-8") if args.text is not None else read_document(Path(file))
    return CommandResult(*data_answer(Path(args.run), document, exclude=args.exclude is not None))


def add_parser(sub, parents: list) -> None:
    """Register ``data`` on the CLI's subparsers (``parents`` give --json)."""
    d = sub.add_parser("data", parents=parents,
                       help="did a run train on a document? a verified inclusion or exclusion proof")
    d.add_argument("run", help="a run directory (manifest.cbor, samples.bin)")
    ask = d.add_mutually_exclusive_group(required=True)
    ask.add_argument("--include", nargs="?", const="", metavar="FILE",
                     help="was the document (FILE's exact bytes, or --text) used? exit 0 if so, 3 if not")
    ask.add_argument("--exclude", nargs="?", const="", metavar="FILE",
                     help="prove the document was not used: exit 0 if so, 3 if it was")
    d.add_argument("--text", help="the document: this text's UTF-8 bytes")
    d.set_defaults(func=cmd_data)

