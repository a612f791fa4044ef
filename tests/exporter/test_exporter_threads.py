"""``ThreadPool``: a bounded pool of daemon threads, refusing at once past its bound."""

from __future__ import annotations

import asyncio
import threading

import pytest

from gpuscope.exporter.threads import Busy, ThreadPool


async def test_past_its_bound_the_pool_refuses_at_once_and_takes_jobs_again_after() -> None:
    pool = ThreadPool("test-pool", threads=1, max_pending=2)
    release = threading.Event()
    try:
        running = pool.submit(release.wait)
        waiting = pool.submit(lambda: 7)
        with pytest.raises(Busy):
            pool.submit(lambda: 8)
        release.set()
        assert await running is True and await waiting == 7
        assert pool.pending == 0
        assert await pool.submit(lambda: 9) == 9
    finally:
        release.set()
        pool.close()


async def test_a_caller_that_gives_up_frees_no_slot_until_its_job_has_left_the_thread() -> None:
    pool = ThreadPool("test-pool", threads=1, max_pending=1)
    started, release = threading.Event(), threading.Event()

    def job() -> None:
        started.set()
        release.wait()

    try:
        future = pool.submit(job)
        await asyncio.to_thread(started.wait)
        future.cancel()
        with pytest.raises(Busy):  # the thread is still busy with it
            pool.submit(lambda: None)
        release.set()
        for _ in range(3000):
            if pool.pending == 0:
                break
            await asyncio.sleep(0.01)
        assert await pool.submit(lambda: "free") == "free"
    finally:
        release.set()
        pool.close()


async def test_a_job_s_exception_reaches_its_caller_and_the_threads_are_daemons() -> None:
    pool = ThreadPool("test-pool", threads=2, max_pending=2)
    try:

        def fail() -> None:
            raise ValueError("from the job")

        with pytest.raises(ValueError, match="from the job"):
            await pool.submit(fail)
        assert all(thread.daemon for thread in pool.threads)
    finally:
        pool.close()
