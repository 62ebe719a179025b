"""A dispute's op data on disk (node/op_data.py): read in pieces from an unnamed file, its header
checked against the file; the files held at once bounded (a dispute beyond waits for one to
close); what a crash left in the directory cleared at start."""

from pathlib import Path

import pytest
import trio
import trio.testing

from open1b.deterministic.dispute_replay import OP_FILE_HEAD
from open1b.node.op_data import OpFiles
from open1b.node.worker import ReplayFailed
from open1b.protocol.codec import encode

INPUT, OUTPUT = bytes(range(256)) * 3, b"\x07" * 100


def _write(path: str, *, extra: bytes = b"") -> None:
    header = encode({"inputs": [[len(INPUT), None]], "outputs": [len(OUTPUT)]})
    Path(path).write_bytes(OP_FILE_HEAD.pack(len(header)) + header + INPUT + OUTPUT + extra)


async def _written(path: str) -> None:
    _write(path)


def test_op_data_is_read_in_pieces_from_a_file_no_one_can_name(tmp_path):
    files = OpFiles(tmp_path / "disputes")

    async def main():
        data = await files.write(_written)
        named = list((tmp_path / "disputes").iterdir())
        got = (data.inputs[0].data.read(0, 10), data.inputs[0].data.read(760, 64), data.outputs[0].read(0, 1000))
        data.close()
        data.close()  # once only: the place it held is given back once
        return named, got, files.held.borrowed_tokens

    named, got, held = trio.run(main)
    assert named == [] and held == 0
    assert got == (INPUT[:10], INPUT[760:], OUTPUT)


def test_a_file_whose_sizes_disagree_with_its_header_is_refused_and_its_place_given_back(tmp_path):
    files = OpFiles(tmp_path / "disputes")

    async def longer(path):
        _write(path, extra=b"\x00")

    async def main():
        with pytest.raises(ReplayFailed, match="end at byte"):
            await files.write(longer)
        return files.held.borrowed_tokens, list((tmp_path / "disputes").iterdir())

    assert trio.run(main) == (0, [])


def test_files_held_at_once_are_bounded_and_leftovers_cleared(tmp_path):
    (tmp_path / "disputes").mkdir()
    (tmp_path / "disputes" / "crashed.op").write_bytes(b"left by a crash")
    files = OpFiles(tmp_path / "disputes", at_once=1)
    files.clear_leftovers()
    assert list((tmp_path / "disputes").iterdir()) == []

    async def main():
        first = await files.write(_written)
        second = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: _append(second, files.write(_written)))
            await trio.testing.wait_all_tasks_blocked()
            waiting = not second  # the second waits while the first is held
            first.close()
        second[0].close()
        return waiting

    assert trio.run(main)


async def _append(to: list, awaitable) -> None:
    to.append(await awaitable)
