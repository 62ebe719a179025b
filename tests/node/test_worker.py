import pytest
import trio

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
