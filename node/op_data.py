"""A dispute's op data on disk (docs/protocol.md §18.5): the inputs and outputs of the op a
bisection reached, up to ``MAX_OP_FILE`` (1 GiB) each time, kept in the file the worker wrote
(:func:`open1b.deterministic.dispute_replay.write_dispute_file`) and read in pieces — a chunk to
hash, a chunk to send, the chunks a proof carries — never whole. Held in memory, 6 disputes at once
(4 answered, 2 opened) could hold 6 GiB on a home node of 8–24 GB.

The file lives in the node's ``disputes/`` directory only while the worker writes it: the daemon
opens it and unlinks it at once, so its bytes go with the descriptor, whatever ends the process
(like the replay's spill file); :func:`clear_leftovers` removes what a crash left between a write
and that unlink. :class:`OpFiles` bounds the disk: ``at_once`` files held (each at most
``MAX_OP_FILE``); a dispute that needs another waits for one to close.
"""

from __future__ import annotations

import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import cbor2
import trio

from open1b.deterministic.dispute_replay import OP_FILE_HEAD
from open1b.protocol import TensorProof
from open1b.protocol.dispute.proof import InputBytes

from .files import FileRefused, open_regular
from .worker import ReplayFailed

MAX_OP_FILE = 1 << 30  # one op's inputs and outputs (a product's whole matrices)
MAX_OP_HEADER = 1 << 20  # sizes and tensor proofs of at most 128 inputs
# Files held at once: one per dispute a node runs at once (4 answered, 2 opened), so none waits for
# another to end (2 did: two peers slow in their op data could stall this node's other disputes
# past their peers' compute waits); 6 GiB of disk at most, beside a gpt-1b replay's 22 GB.
OP_FILES_AT_ONCE = 6


class FilePiece:
    """One tensor's bytes in an open op-data file (:class:`open1b.protocol.dispute.trace.Pieces`)."""

    def __init__(self, fd: int, offset: int, nbytes: int) -> None:
        self.fd, self.offset, self.nbytes = fd, offset, nbytes

    def read(self, offset: int, size: int) -> bytes:
        """Bytes ``[offset, offset + size)`` of the tensor (fewer at its end); :class:`ReplayFailed`
        if the file cannot give them (our disk's fault, never the peer's)."""
        size = max(0, min(size, self.nbytes - offset))
        try:
            data = os.pread(self.fd, size, self.offset + offset)
        except OSError as exc:
            raise ReplayFailed(f"the op-data file: {exc}") from exc
        if len(data) != size:
            raise ReplayFailed(f"the op-data file ended {size - len(data)} bytes early")
        return data


@dataclass(frozen=True)
class OpData:
    """An op's inputs (with their tensor proofs) and outputs as this party computed them: bytes, or
    :class:`FilePiece` objects of one open file (the worker's); ``close`` lets go of what holds them."""

    inputs: Sequence[InputBytes]
    outputs: Sequence[bytes | FilePiece]
    close: Callable[[], None] = lambda: None


def _proof(fields) -> TensorProof:
    return TensorProof(**{**fields, "path": tuple(fields["path"])})


def read_op_file(fd: int, release: Callable[[], None]) -> OpData:
    """The op data in the open file ``fd`` (the layout of ``write_dispute_file``), its header
    checked and its sizes summed against the file's; :class:`ReplayFailed` if it is not so. Its
    ``close`` closes ``fd``, then calls ``release``."""
    size = os.fstat(fd).st_size
    try:
        (n,) = OP_FILE_HEAD.unpack(os.pread(fd, OP_FILE_HEAD.size, 0))
        if n > MAX_OP_HEADER:
            raise ValueError(f"a header of {n} bytes")
        header = cbor2.loads(os.pread(fd, n, OP_FILE_HEAD.size))
        offset, inputs, outputs = OP_FILE_HEAD.size + n, [], []
        for nbytes, proof in header["inputs"]:
            inputs.append(InputBytes(FilePiece(fd, offset, nbytes), None if proof is None else _proof(proof)))
            offset += nbytes
        for nbytes in header["outputs"]:
            outputs.append(FilePiece(fd, offset, nbytes))
            offset += nbytes
        if offset != size:
            raise ValueError(f"its tensors end at byte {offset} of {size}")
    except (cbor2.CBORDecodeError, struct.error, KeyError, TypeError, ValueError) as exc:
        raise ReplayFailed(f"malformed op file: {exc}") from exc
    closed = []

    def close() -> None:
        if not closed:
            closed.append(True)
            os.close(fd)
            release()

    return OpData(inputs, outputs, close)


class OpFiles:
    """Where the worker writes op data, and how much of it is held at once (module doc)."""

    def __init__(self, directory: Path, at_once: int = OP_FILES_AT_ONCE) -> None:
        self.directory, self.held = directory, trio.CapacityLimiter(at_once)

    def clear_leftovers(self) -> None:
        """Remove the files a crash left between a worker's write and the daemon's unlink."""
        if self.directory.is_dir():
            for path in self.directory.iterdir():
                path.unlink(missing_ok=True)

    async def write(self, request) -> OpData:
        """A place among the files held, then ``request(path)`` (the worker writes the file), opened and
        unlinked at once; the place is the returned :class:`OpData`'s until it is closed."""
        token = object()
        await self.held.acquire_on_behalf_of(token)
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd, out = tempfile.mkstemp(dir=self.directory, suffix=".op")
            os.close(fd)
            try:
                await request(out)
                fd, _ = open_regular(Path(out), MAX_OP_FILE)
            except (FileRefused, OSError) as exc:
                raise ReplayFailed(f"the worker's op file: {exc}") from exc
            finally:
                Path(out).unlink(missing_ok=True)
            try:
                return await trio.to_thread.run_sync(read_op_file, fd, lambda: self.held.release_on_behalf_of(token))
            except BaseException:
                os.close(fd)
                raise
        except BaseException:
            self.held.release_on_behalf_of(token)
            raise
