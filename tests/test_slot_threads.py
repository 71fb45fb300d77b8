"""Unit: the worker's threads for blocking calls (actors/worker_process.py SlotThreads): a call
whose caller gave up keeps running (a thread cannot be stopped) but does not keep its slot."""
import asyncio
import threading
import time

import pytest

from actors.worker_process import SlotThreads


def test_a_call_past_its_timeout_leaves_its_slot_to_the_next():
    threads = SlotThreads(1)
    started, release = threading.Event(), threading.Event()

    def stuck():
        started.set()
        release.wait(30)

    async def go():
        call = asyncio.ensure_future(threads.call(stuck))
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)   # on its thread now
        call.cancel()   # its caller gives up (a step's timeout)
        with pytest.raises(asyncio.CancelledError):
            await call
        # not behind the stuck call (which holds its thread 30 s)
        quick = await asyncio.wait_for(threads.call(lambda: "next"), 5)
        during = (threads.busy, threads.abandoned)
        release.set()
        for _ in range(200):
            if threads.busy == 0:
                break
            await asyncio.sleep(0.01)
        return quick, during, (threads.busy, threads.abandoned)

    quick, during, after = asyncio.run(go())
    assert quick == "next"
    assert during == (1, 1)                     # the stuck one still runs, counted
    assert after == (0, 0)


def test_no_more_calls_run_at_once_than_slots():
    threads = SlotThreads(2)
    lock = threading.Lock()
    now = {"running": 0, "peak": 0}

    def work():
        with lock:
            now["running"] += 1
            now["peak"] = max(now["peak"], now["running"])
        time.sleep(0.05)
        with lock:
            now["running"] -= 1

    async def go():
        await asyncio.gather(*(threads.call(work) for _ in range(8)))

    asyncio.run(go())
    assert now["peak"] == 2


def test_a_call_given_up_before_it_started_never_runs():
    threads = SlotThreads(1)
    release = threading.Event()
    ran = []

    async def go():
        first = asyncio.ensure_future(threads.call(lambda: release.wait(10)))
        await asyncio.sleep(0.05)
        with pytest.raises(TimeoutError):      # waits for the slot, then gives up
            await asyncio.wait_for(threads.call(lambda: ran.append(1)), 0.1)
        release.set()
        await first
        await asyncio.sleep(0.1)
        return threads.busy, threads.abandoned

    assert asyncio.run(go()) == (0, 0)
    assert ran == []
