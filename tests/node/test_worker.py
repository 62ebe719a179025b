import pytest
import trio
import trio.testing

from open1b.deterministic.device import cpu_device_class
from open1b.node.worker import ReplayFailed, ReplayWorker


def test_worker_replays_reports_errors_and_restarts(tampered_run):
    run_dir, manifest = tampered_run

    async def main():
        worker = ReplayWorker()
        try:
            ok = await worker.replay(run_dir, 1, timeout_s=120)
            assert ok.pre_state == manifest.state_hashes[1] and ok.post_state == manifest.state_hashes[2]
            assert ok.device == worker.device == cpu_device_class()  # auto, and no GPU here
            forged = await worker.replay(run_dir, 2, timeout_s=60)
            assert forged.pre_state == manifest.state_hashes[2] and forged.post_state != manifest.state_hashes[3]
            try:
                await worker.replay(run_dir, manifest.steps, timeout_s=60)
            except ReplayFailed as exc:
                assert "outside" in str(exc)
            else:
                raise AssertionError("a step outside the run must fail")
            assert worker.restarts == 1  # bad input does not cost the process
            try:
                await worker.replay(run_dir, 0, timeout_s=0.001)
            except ReplayFailed as exc:
                assert "timed out" in str(exc)
            else:
                raise AssertionError("expected a timeout")
            again = await worker.replay(run_dir, 0, timeout_s=120)
            assert again.post_state == manifest.state_hashes[1]
            assert worker.restarts == 2  # the timed-out process was killed and replaced
        finally:
            await worker.aclose()

    trio.run(main)


def test_worker_chooses_its_device_and_falls_back_to_the_cpu(tampered_run):
    """The device is chosen and self-checked in the worker process (never the daemon's), at start;
    a GPU asked for and missing leaves the CPU, which gives the same bits, and says so."""
    run_dir, manifest = tampered_run

    async def main():
        worker = ReplayWorker("cuda:0")
        try:
            await worker.start(timeout_s=120)
            assert worker.device == cpu_device_class() and worker.restarts == 1
            assert "cuda:0 is not available" in worker.device_reason and "using the CPU" in worker.device_reason
            result = await worker.replay(run_dir, 0, timeout_s=120)
            assert result.post_state == manifest.state_hashes[1] and result.device == cpu_device_class()
            assert worker.restarts == 1  # started once, by start()
        finally:
            await worker.aclose()
        broken = ReplayWorker("tpu")  # refused by the worker itself (config refuses it before, too)
        with pytest.raises(ReplayFailed, match="could not start.*device must be auto, cpu"):
            await broken.replay(run_dir, 0, timeout_s=120)
        broken.kill()

    trio.run(main)


def test_worker_answers_a_challenge_and_spot_checks_with_it(tampered_run, tmp_path):
    """The trainer's answer and the verifier's check both run in the worker process; the answer
    travels as a file. An honest step passes with its answer, fails ``no_answer`` without one, and
    fails ``proof`` with bytes that are not an answer."""
    from open1b.protocol import challenge_signature, slot_signature
    from tests.node.conftest import ident

    run_dir, manifest = tampered_run
    challenge = challenge_signature(ident(5), manifest.run_id, 1)
    challenges, mine = (challenge, slot_signature(ident(5), manifest.run_id, 1)), tmp_path / "slot.f32"

    async def main():
        worker = ReplayWorker()
        try:
            size = await worker.answer(run_dir, 1, challenge, tmp_path / "answer.cbor", timeout_s=120)
            assert size == (tmp_path / "answer.cbor").stat().st_size > 0
            ok = await worker.spot(run_dir, 1, challenges, tmp_path / "answer.cbor", mine, timeout_s=120)
            assert ok.passed and ok.caught == "none" and ok.device == cpu_device_class()
            assert 0 <= ok.slot < 4 and len(ok.chunks) == min(4, ok.chunks_total) and len(ok.fingerprint) == 32
            silent = await worker.spot(run_dir, 1, challenges, None, mine, timeout_s=120)
            assert (silent.passed, silent.caught, silent.slot, silent.chunks) == (False, "no_answer", ok.slot, ok.chunks)
            (tmp_path / "junk.cbor").write_bytes(b"\xa0")
            junk = await worker.spot(run_dir, 1, challenges, tmp_path / "junk.cbor", mine, timeout_s=120)
            assert junk.caught == "proof"
            # the halves: the micro half leaves the slot's chunks in the file the answer half reads
            micro = await worker.spot(run_dir, 1, challenges, None, mine, timeout_s=120, links=("micro",))
            assert micro.passed and mine.stat().st_size > 0
            half = await worker.spot(run_dir, 1, challenges, tmp_path / "answer.cbor", mine, timeout_s=120,
                                     links=("answer",))
            assert half.passed
            mine.write_bytes(bytes(mine.stat().st_size))  # not the slot's chunks: the trainer's answer is not them
            assert (await worker.spot(run_dir, 1, challenges, tmp_path / "answer.cbor", mine, timeout_s=120,
                                      links=("answer",))).caught == "gradient"
            with pytest.raises(ReplayFailed, match="outside"):  # no verdict on a step the run lacks
                await worker.spot(run_dir, manifest.steps, challenges, None, mine, timeout_s=120)
            assert worker.restarts == 1
        finally:
            await worker.aclose()

    trio.run(main)


def test_worker_spills_into_the_directory_it_is_given(tampered_run, tmp_path):
    """The daemon gives its data directory's ``spill``: the worker makes it (its own) and replays
    with its spill file there, which has no name, so the directory stays empty."""
    run_dir, manifest = tampered_run
    spill = tmp_path / "data" / "spill"

    async def main():
        worker = ReplayWorker("cpu", spill_dir=spill)
        try:
            ok = await worker.replay(run_dir, 1, timeout_s=120)
            assert ok.post_state == manifest.state_hashes[2]
        finally:
            await worker.aclose()

    trio.run(main)
    assert spill.is_dir() and spill.stat().st_mode & 0o777 == 0o700 and list(spill.iterdir()) == []


def test_a_disputes_trace_goes_before_the_replays_waiting(tampered_run, tmp_path):
    run_dir, manifest = tampered_run
    done = []

    async def main():
        worker = ReplayWorker()
        try:
            await worker.start(timeout_s=120)

            async def replay(step):
                await worker.replay(run_dir, step, timeout_s=120)
                done.append(f"replay {step}")

            async def trace():
                out = tmp_path / "trace.cbor"
                reply = await worker.request({"op": "trace", "run_dir": str(run_dir), "step": 0, "out": str(out)},
                                             timeout_s=120, what="trace of step 0", urgent=True)
                assert reply["size"] == out.stat().st_size > 0
                done.append("trace")

            async with trio.open_nursery() as nursery:
                async with worker._turns.turn():  # the worker busy: what comes now waits
                    nursery.start_soon(replay, 0)
                    await trio.testing.wait_all_tasks_blocked()
                    nursery.start_soon(replay, 1)
                    await trio.testing.wait_all_tasks_blocked()
                    nursery.start_soon(trace)
                    await trio.testing.wait_all_tasks_blocked()
                    assert worker._turns.waiting == 3
        finally:
            await worker.aclose()

    trio.run(main)
    assert done == ["trace", "replay 0", "replay 1"]


def test_a_request_that_times_out_waiting_for_anothers_start_leaves_that_start_alone():
    async def main():
        worker = ReplayWorker()
        starting = await trio.lowlevel.open_process(["sleep", "60"])  # the daemon's start, reading its hello
        done = trio.Event()

        async def start_under_way(task_status=trio.TASK_STATUS_IGNORED):
            async with worker._starting:
                worker._proc = starting
                task_status.started()
                await done.wait()

        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(start_under_way)
                with pytest.raises(ReplayFailed, match="timed out"):
                    await worker.request({"run_dir": "/nowhere", "step": 0}, timeout_s=0.2, what="replay of step 0")
                assert starting.returncode is None and worker._proc is starting
                done.set()
        finally:
            starting.kill()
            await starting.wait()

    trio.run(main)
