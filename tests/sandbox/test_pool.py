"""WorkerPool: started workers ready ahead of need, never more than the plays announced, made
by the executor it is given (local jails by default)."""

import pytest

from sandbox.jail import Sandbox, SandboxUnavailable
from sandbox.pool import WorkerPool


def test_take_hands_out_started_workers_and_keeps_within_budget(nsjail_ok):
    with WorkerPool(Sandbox(), ready=2, plays=3) as pool:
        workers = [pool.take() for _ in range(3)]
        assert [w.call("ping").result for w in workers] == ["pong"] * 3
        assert len({id(w) for w in workers}) == 3
        assert pool.budget == 0 and pool.pending == []
        extra = pool.take()  # more plays than announced still get a worker
        assert extra.call("ping").result == "pong"
        for worker in workers + [extra]:
            worker.close()


def test_close_stops_workers_never_taken(nsjail_ok):
    pool = WorkerPool(Sandbox(), ready=3, plays=10)
    started = [future.result() for future in list(pool.pending)]
    pool.close()
    assert all(worker.proc is None for worker in started)


def test_a_jail_that_cannot_start_surfaces_on_take(tmp_path):
    pool = WorkerPool(Sandbox(nsjail=str(tmp_path / "no-nsjail")), ready=1, plays=1)
    with pytest.raises(SandboxUnavailable):
        pool.take()
    pool.close()


class CountingExecutor:
    """Where jails run, as the pool sees an executor: it makes unstarted workers."""

    starts = 2

    def __init__(self):
        self.made = []

    def worker(self, sandbox):
        from sandbox.jail import Worker

        worker = Worker(sandbox)
        self.made.append(worker)
        return worker


def test_workers_come_from_the_executor_given(nsjail_ok):
    executor = CountingExecutor()
    with WorkerPool(Sandbox(), ready=2, plays=3, executor=executor) as pool:
        workers = [pool.take() for _ in range(3)]
        assert [w.call("ping").result for w in workers] == ["pong"] * 3
        for worker in workers:
            pool.retire(worker)
    assert {id(w) for w in workers} == {id(w) for w in executor.made}
