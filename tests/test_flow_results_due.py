"""A run parks or ends only once the ASYNC results its worker names as unanswered are in, with
fakes for the bus and the log (the end-to-end case, a result the broker bounced, is in
test_e2e_flows.py)."""
import asyncio
import logging
import time

from actors.flow_runs import Flows
from actors.flow_state import Run, apply
from broker.protocol import Kind, Message


class Bus:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Kind, dict]] = []

    def send(self, dest: str, kind: Kind, body: dict, **_) -> None:
        self.sent.append((dest, kind, body))

    def reply(self, msg: Message, kind: Kind, body: dict) -> None:
        self.sent.append((msg.src, kind, body))

    def spawn(self, coro) -> asyncio.Task:
        return asyncio.ensure_future(coro)


class Log:
    def __init__(self) -> None:
        self.appended: list[dict] = []

    async def append(self, kind, body, session, sync=True):
        self.appended.append(body)

    async def append_kept(self, kind, body, session):
        self.appended.append(body)


def running_flows() -> tuple[Flows, Bus, Log, Run]:
    """An actor's flows (call from a running loop) holding run r-1, in its execution 7."""
    bus, log = Bus(), Log()
    flows = Flows(bus=bus, log=log, query=None, index=0, shards=1, logger=logging.getLogger("test"))
    flows.ready.set()
    run = Run("r-1", "steps", "t")
    apply(run, {"run": "r-1", "tenant": "t", "at": time.time(), "type": "run.started", "flow": "steps",
                "exec": 7, "input": {}})
    flows.runs[run.run_id] = run
    return flows, bus, log, run


def from_worker(kind: Kind, msg_id: int, **body) -> Message:
    return Message("worker/0#1", kind, msg_id, time.time(), 0, "r-1", "", {"run_id": "r-1", "exec": 7, **body})


def test_a_completion_naming_a_result_not_yet_in_waits_for_it_and_the_journal_has_the_step():
    async def main():
        flows, bus, log, run = running_flows()
        # the step's result went first and was bounced; the completion overtook its resend
        complete = asyncio.ensure_future(flows.on_complete(from_worker(Kind.FLOW_COMPLETE, 2, ok=True, result=10,
                                                                       results_due=[0])))
        await asyncio.sleep(0.3)
        assert not complete.done() and not run.ended
        await flows.on_step_result(from_worker(Kind.STEP_RESULT, 1, seq=0, attempt=1, ok=True, result=10,
                                               sync=False, name="slow"))
        await asyncio.wait_for(complete, 2.0)
        types = [body["type"] for body in log.appended]
        assert run.status == "completed" and run.ops[0].done and run.ops[0].result == 10
        assert types.index("step.done") < types.index("run.ended"), types
        assert bus.sent[-1] == ("worker/0#1", Kind.FLOW_ACK, {"ok": True})

    asyncio.run(main())


def test_a_completion_naming_results_already_in_or_never_coming_is_not_held_for_good(monkeypatch):
    from actors import worker_requests

    monkeypatch.setattr(worker_requests, "RESULTS_DUE_SECS", 0.3)

    async def main():
        flows, bus, log, run = running_flows()
        await flows.on_step_result(from_worker(Kind.STEP_RESULT, 1, seq=0, attempt=1, ok=True, result=1,
                                               sync=False, name="a"))
        began = time.monotonic()
        await asyncio.wait_for(flows.on_complete(from_worker(Kind.FLOW_COMPLETE, 3, ok=True, result=1,
                                                             results_due=[0, 1, "x"])), 2.0)
        assert run.status == "completed" and time.monotonic() - began >= 0.25   # 1 never came, 0 was in

    asyncio.run(main())



def test_the_wait_for_a_result_does_not_count_a_stall_of_the_actor(monkeypatch):
    """An actor stopped (SIGSTOP, a paused VM) longer than the wait woke to the result unread in
    its socket and a wait already expired: the run ended without the step in its journal."""
    from actors import worker_requests

    monkeypatch.setattr(worker_requests, "RESULTS_DUE_SECS", 0.5)

    async def main():
        flows, bus, log, run = running_flows()
        complete = asyncio.ensure_future(flows.on_complete(from_worker(Kind.FLOW_COMPLETE, 2, ok=True, result=10,
                                                                       results_due=[0])))
        await asyncio.sleep(0.1)
        time.sleep(1.0)                    # the whole actor stopped; the result came meanwhile…
        result = from_worker(Kind.STEP_RESULT, 1, seq=0, attempt=1, ok=True, result=10, sync=False, name="slow")
        asyncio.get_running_loop().call_later(0.05, lambda: asyncio.ensure_future(flows.on_step_result(result)))
        await asyncio.wait_for(complete, 2.0)   # …and is read a little after it woke
        types = [body["type"] for body in log.appended]
        assert "step.done" in types and types.index("step.done") < types.index("run.ended"), types

    asyncio.run(main())
