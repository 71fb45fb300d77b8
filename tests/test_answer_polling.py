"""gateway/answer_polling.py: the loop polls for a window after each answer, then sleeps again."""
import asyncio

from gateway import answer_polling
from gateway.answer_polling import AnswerPolling


def test_polling_runs_from_each_answer_for_its_window_then_stops(monkeypatch):
    import types
    clock = [0.0]   # moved by the test only: a stall of this machine does not end the window
    monkeypatch.setattr(answer_polling, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))

    async def go():
        polling = AnswerPolling(0.05)
        polling.loop = asyncio.get_running_loop()
        polling.answered()
        await asyncio.sleep(0.01)
        during = polling._polling
        clock[0] = 0.06
        await asyncio.sleep(0.01)
        return during, polling._polling
    assert asyncio.run(go()) == (True, False)


def test_no_window_or_no_loop_means_no_polling():
    async def go():
        off = AnswerPolling(0.0)
        off.loop = asyncio.get_running_loop()
        off.answered()
        unstarted = AnswerPolling(0.05)     # a server not started on a loop (a unit test's connection)
        unstarted.answered()
        await asyncio.sleep(0)
        return off._polling, unstarted._polling
    assert asyncio.run(go()) == (False, False)


def test_polling_yields_the_cpu_at_each_poll_and_not_after_its_window(monkeypatch):
    import types
    yields = []
    monkeypatch.setattr(answer_polling.os, "sched_yield", lambda: yields.append(1))
    clock = [0.0]   # moved by the test only
    monkeypatch.setattr(answer_polling, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))

    async def go():
        polling = AnswerPolling(0.02)
        polling.loop = asyncio.get_running_loop()
        polling.answered()
        await asyncio.sleep(0.01)
        during = len(yields)
        clock[0] = 0.03
        await asyncio.sleep(0.05)
        after_window = len(yields)
        await asyncio.sleep(0.05)
        return during, after_window, len(yields)
    during, after_window, last = asyncio.run(go())
    assert during > 0                   # a client woken on the gateway's CPU gets it while we poll
    assert last == after_window         # an idle gateway neither polls nor yields
