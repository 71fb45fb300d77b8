"""agentos/service.py's lifelong tasks: one that dies of an error stops its process loudly (for the
supervisor to restart it) instead of leaving it up without the loop; one that ends well or is
cancelled does nothing."""
import asyncio
import logging

from agentos import service


def test_a_lifelong_task_that_dies_stops_its_process_with_a_failure(caplog):
    async def ticker():
        await asyncio.sleep(0.01)
        raise KeyError("a bad item")

    async def main(stop: asyncio.Event) -> int:
        service.lifelong(ticker())
        await asyncio.wait_for(stop.wait(), 10)   # set by the ticker's death, not by a signal
        return service.EXIT_OK

    with caplog.at_level(logging.CRITICAL, logger="agent-os"):
        assert service.run(main) == service.EXIT_FAILURE
    (record,) = [r for r in caplog.records if r.levelno == logging.CRITICAL]
    assert "ticker died (KeyError: 'a bad item')" in record.getMessage() and record.exc_info is not None


def test_lifelong_tasks_that_end_well_or_are_cancelled_leave_the_process_be(caplog):
    async def loader():
        await asyncio.sleep(0)

    async def watchdog():
        await asyncio.Event().wait()

    async def main(stop: asyncio.Event) -> int:
        done = service.lifelong(loader())
        forever = service.lifelong(watchdog())
        await done
        forever.cancel()
        await asyncio.sleep(0.05)
        assert not stop.is_set()
        return 7

    with caplog.at_level(logging.CRITICAL, logger="agent-os"):
        assert service.run(main) == 7
    assert not [r for r in caplog.records if r.levelno == logging.CRITICAL]
