"""Spot checks from checkpoints held in part (deterministic/spot_state.py): the chunks
``spot_pieces`` names are all a check reads, a check from them gives exactly the verdict the
whole checkpoints give, and a missing chunk or a table that does not prove h_k is refused."""

import math
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from open1b.deterministic import PRESETS
from open1b.deterministic.checkpoint_stream import scan_checkpoint
from open1b.deterministic.errors import CheckpointMismatchError
from open1b.deterministic.fingerprint import CHUNK_ELEMENTS, chunk_count
from open1b.deterministic.runfile import checkpoint_path
from open1b.deterministic.spot_run import answer_from_run, check_spot
from open1b.deterministic.spot_state import AFTER, BEFORE, part_paths, spot_pieces
from open1b.deterministic.trainer import publish_run
from open1b.protocol import Identity, blake2b256
from open1b.protocol.commitments import CHUNK_SIZE
from open1b.protocol.spotcheck import challenge_signature, derive_chunks, slot_signature

TRAINER, VERIFIER = Identity(blake2b256(b"tests/spot-state/trainer")), Identity(blake2b256(b"tests/spot-state/verifier"))
STEP = 1
CONFIG = PRESETS["tiny"].config


def hold_in_part(source: Path, target: Path, k: int, pieces: dict[str, tuple[int, ...]]) -> int:
    """Checkpoint k of the run in ``source`` as a spot check's fetch leaves it in ``target``: a
    sparse file with only ``pieces`` written, and the chunk table. Returns the chunk bytes written."""
    path = checkpoint_path(source, k)
    scan = scan_checkpoint(path, CONFIG, k, keep=None)
    part, table = part_paths(target, k)
    part.parent.mkdir(parents=True, exist_ok=True)
    data, written = path.read_bytes(), 0
    with open(part, "wb") as f:
        f.truncate(len(data))
        first = min(s.offset for s in scan.slots.values())
        f.write(data[:first])  # the header
        for name, chunks in pieces.items():
            slot = scan.slots[name]
            for i in chunks:
                lo, hi = slot.offset + i * CHUNK_SIZE, slot.offset + min((i + 1) * CHUNK_SIZE, slot.nbytes)
                f.seek(lo)
                f.write(data[lo:hi])
                written += hi - lo
    table.write_bytes(b"".join(d for n in sorted(scan.digests, key=str.encode) for d in scan.digests[n]))
    return written




@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("spot-state")
    manifest = publish_run(root / "run", TRAINER, steps=2, seed=5)
    challenge = challenge_signature(VERIFIER, manifest.run_id, STEP)
    return root / "run", manifest, challenge, slot_signature(VERIFIER, manifest.run_id, STEP), \
        answer_from_run(root / "run", STEP, challenge)


def verifier_dir(run_dir: Path, target: Path, chunks, *, drop: tuple[str, int] | None = None) -> Path:
    """The verifier's run directory: the run's small files, checkpoints k and k+1 held in part."""
    shutil.copytree(run_dir, target, ignore=shutil.ignore_patterns("*.safetensors"))
    for k, which in ((STEP, BEFORE), (STEP + 1, AFTER)):
        pieces = spot_pieces(CONFIG, chunks, which)
        if drop is not None and drop[1] == k:
            pieces = {n: c for n, c in pieces.items() if n != drop[0]}
        hold_in_part(run_dir, target, k, pieces)
    return target


def test_spot_pieces_cover_every_element_a_check_reads():
    config = PRESETS["small"].config
    chunks = derive_chunks(b"any challenge", chunk_count(config))
    before, after = spot_pieces(config, chunks, BEFORE), spot_pieces(config, chunks, AFTER)
    offset = 0
    for name, shape in config.param_shapes().items():
        size = math.prod(shape)
        assert before[f"param/{name}"] == tuple(range(-(-4 * size // CHUNK_SIZE)))  # the recomputation reads all
        for c in chunks:
            a, b = max(c * CHUNK_ELEMENTS, offset), min((c + 1) * CHUNK_ELEMENTS, offset + size)
            for element in range(a, b, 997) if a < b else ():
                held = (4 * (element - offset)) // CHUNK_SIZE
                for key in (f"adam_m/{name}", f"adam_v/{name}"):
                    assert held in before[key] and held in after[key]
                assert held in after[f"param/{name}"]
        # and no more than that: one or two 1 MiB chunks of each tensor per gradient chunk it meets
        meets = sum(max(c * CHUNK_ELEMENTS, offset) < min((c + 1) * CHUNK_ELEMENTS, offset + size) for c in chunks)
        assert len(after.get(f"adam_m/{name}", ())) <= 2 * meets and (meets == 0) == (f"adam_m/{name}" not in after)
        offset += size
    assert before["adam/beta1_pow"] == after["adam/beta2_pow"] == (0,)


def test_a_check_from_chunks_held_in_part_gives_the_whole_checkpoints_verdict(run, tmp_path):
    run_dir, manifest, challenge, slot_challenge, answer = run
    chunks = derive_chunks(challenge, chunk_count(CONFIG))
    whole = check_spot(run_dir, STEP, challenge, slot_challenge, answer)
    part_dir = verifier_dir(run_dir, tmp_path / "verifier", chunks)
    assert not checkpoint_path(part_dir, STEP).exists() and part_paths(part_dir, STEP)[0].exists()
    part = check_spot(part_dir, STEP, challenge, slot_challenge, answer)
    assert whole.passed and (part.caught, part.slot, part.chunks, part.recomputed) == (
        whole.caught, whole.slot, whole.chunks, whole.recomputed)
    # a forged answer is caught the same way from the pieces
    forged = bytearray(answer)
    forged[-5] ^= 1
    assert check_spot(part_dir, STEP, challenge, slot_challenge, bytes(forged)).caught == \
        check_spot(run_dir, STEP, challenge, slot_challenge, bytes(forged)).caught != "none"


def test_a_chunk_not_held_is_refused_not_computed_on(run, tmp_path):
    run_dir, _, challenge, slot_challenge, answer = run
    chunks = derive_chunks(challenge, chunk_count(CONFIG))
    name = next(n for n in spot_pieces(CONFIG, chunks, AFTER) if n.startswith("adam_v/"))
    part_dir = verifier_dir(run_dir, tmp_path / "verifier", chunks, drop=(name, STEP + 1))
    with pytest.raises(CheckpointMismatchError, match="not held"):
        check_spot(part_dir, STEP, challenge, slot_challenge, answer)


def test_a_table_that_does_not_prove_h_k_is_refused(run, tmp_path):
    run_dir, _, challenge, slot_challenge, answer = run
    part_dir = verifier_dir(run_dir, tmp_path / "verifier", derive_chunks(challenge, chunk_count(CONFIG)))
    table = part_paths(part_dir, STEP)[1]
    data = bytearray(table.read_bytes())
    data[7] ^= 1
    table.write_bytes(bytes(data))
    with pytest.raises(CheckpointMismatchError, match="does not hash to the published h_1"):
        check_spot(part_dir, STEP, challenge, slot_challenge, answer)
    table.write_bytes(bytes(data[:-1]))
    with pytest.raises(Exception, match="chunk table of"):
        check_spot(part_dir, STEP, challenge, slot_challenge, answer)


def test_a_changed_byte_in_a_held_chunk_is_refused(run, tmp_path):
    run_dir, _, challenge, slot_challenge, answer = run
    part_dir = verifier_dir(run_dir, tmp_path / "verifier", derive_chunks(challenge, chunk_count(CONFIG)))
    part = part_paths(part_dir, STEP)[0]
    fd = os.open(part, os.O_RDWR)
    try:
        os.pwrite(fd, np.float32(1.5).tobytes(), os.fstat(fd).st_size - 4)  # the last parameter's last element
    finally:
        os.close(fd)
    with pytest.raises(CheckpointMismatchError):
        check_spot(part_dir, STEP, challenge, slot_challenge, answer)
