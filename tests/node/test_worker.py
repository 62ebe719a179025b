import trio

from open1b.node.worker import ReplayFailed, ReplayWorker


def test_worker_replays_reports_errors_and_restarts(tampered_run):
    run_dir, manifest = tampered_run

    async def main():
        worker = ReplayWorker()
        try:
            ok = await worker.replay(run_dir, 1, timeout_s=120)
            assert ok.pre_state == manifest.state_hashes[1] and ok.post_state == manifest.state_hashes[2]
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
