"""The supervisor hears a child's exit through its pidfd once, not at every turn of its loop
while the exit waits to be handled (a stop waits on each child it stopped, its monitor not
running: the reader left in place was called 13,777 times in one tree's stop)."""
import asyncio
import subprocess
import sys

import uvloop

from agentos.supervisor import Child, Supervisor


class CountingEvent(asyncio.Event):
    def __init__(self) -> None:
        super().__init__()
        self.sets = 0

    def set(self) -> None:
        self.sets += 1
        super().set()


def test_a_childs_exit_wakes_the_supervisor_once_until_it_is_handled():
    async def scenario() -> tuple[int, int]:
        supervisor = Supervisor.__new__(Supervisor)   # only what watching an exit uses
        supervisor.exited = CountingEvent()
        child = Child("actor", 0)
        child.proc = subprocess.Popen([sys.executable, "-c", "pass"])
        supervisor._watch_exit(child)
        await asyncio.wait_for(supervisor.exited.wait(), 10)
        for _ in range(200):   # the loop turns on, as while a stop waits on another child
            await asyncio.sleep(0)
        await asyncio.sleep(0.05)
        heard = supervisor.exited.sets
        assert child.proc.poll() == 0
        supervisor._unwatch_exit(child)   # as the monitor's handling of the exit does
        return heard, child.exit_fd

    heard, fd = uvloop.run(scenario())   # the supervisor's loop
    assert heard == 1 and fd == -1
