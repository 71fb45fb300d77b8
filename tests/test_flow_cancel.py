"""Cancelling a run, with fakes for the bus and the log: the child runs it waits on hear of it
even when the actor dies before the run's end is durable (the end's append never returns here)."""
import asyncio
import logging
import time

from actors.flow_runs import Flows
from actors.flow_state import Run, apply
from broker.protocol import Kind, Message


class FakeBus:
    def __init__(self) -> None:
        self.requests: list[tuple[str, Kind, dict]] = []
        self.sent: list[tuple[str, Kind, dict]] = []
        self.tasks: set[asyncio.Task] = set()

    async def request(self, dest: str, kind: Kind, body: dict, **_) -> None:
        self.requests.append((dest, kind, body))

    def send(self, dest: str, kind: Kind, body: dict, **_) -> None:
        self.sent.append((dest, kind, body))

    def reply(self, msg: Message, kind: Kind, body: dict) -> None:
        self.sent.append((msg.src, kind, body))

    def spawn(self, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        return task


class LogThatNeverAnswers:
    """The actor's log writer, as seen by an actor that is about to die: no append is ever durable."""

    async def append(self, *_, **__) -> None:
        await asyncio.Event().wait()


def test_a_cancelled_runs_children_are_told_before_its_end_is_durable():
    async def main() -> None:
        bus = FakeBus()
        flows = Flows(bus=bus, log=LogThatNeverAnswers(), query=None, index=0, shards=1,
                      logger=logging.getLogger("test"))
        flows.ready.set()
        run = Run("parent-1", "parent", "t")
        for record in ({"type": "run.started", "flow": "parent", "exec": 1},
                       {"type": "child.started", "seq": 0, "child": "kid-1"},
                       {"type": "child.started", "seq": 1, "child": "kid-2"},
                       {"type": "op.done", "seq": 1, "op": "child", "ok": True}):   # kid-2 has ended
            apply(run, {"run": "parent-1", "tenant": "t", "at": time.time(), **record})
        flows.runs[run.run_id] = run
        cancel = asyncio.ensure_future(flows.on_cancel(
            Message("gateway/0", Kind.FLOW_CANCEL, 1, 0.0, 0, "parent-1", "", {"run_id": "parent-1", "tenant": "t"})))
        for _ in range(10):
            await asyncio.sleep(0)
        assert not cancel.done()                    # the run's end is not durable, and never will be
        assert [(kind, body["run_id"]) for _, kind, body in bus.requests] == [(Kind.FLOW_CANCEL, "kid-1")]
        cancel.cancel()
        for task in bus.tasks:
            task.cancel()

    asyncio.run(main())
