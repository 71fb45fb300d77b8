"""Recovering open runs after an actor start, with a fake store: what is adopted and what is not."""
import asyncio
import logging

from actors.flow_runs import Flows
from actors.flow_state import Run
from broker.protocol import Kind


def _records(run_id: str, flow: str) -> list[dict]:
    return [{"run": run_id, "tenant": "t", "type": "run.started", "flow": flow, "exec": 0, "at": 0.0,
             "input": {"session": "s", "turn": run_id.split("/")[1], "input": "hi"}}]


def test_a_run_begun_while_the_open_runs_query_was_in_flight_is_not_adopted_twice():
    adopted: list[str] = []

    async def main() -> Flows:
        flows = Flows(bus=None, log=None, query=None, index=0, shards=1, logger=logging.getLogger("t"))
        live = Run("s/live", "turn", "t")

        async def query(name: str, session: str, **params) -> dict:
            if name == "open_runs":
                flows.runs[live.run_id] = live   # a turn starts on this actor meanwhile
                return {"rows": [{"run_id": "s/live"}, {"run_id": "s/old"}]}
            return {"rows": _records(session, "turn")}

        flows.query = query
        flows.on_open_turn = lambda run: adopted.append(run.run_id)
        await flows.load()
        assert flows.runs["s/live"] is live
        return flows

    flows = asyncio.run(main())
    assert adopted == ["s/old"] and flows.ready.is_set()


def test_a_recovered_run_waiting_with_a_message_queued_takes_it_and_runs_again():
    """The actor died between a wait's record and its taking of a message published before it:
    after the restart the run takes that message at once, not at the next publish."""
    from test_flow_cancel import FakeBus

    class Log:
        def __init__(self) -> None:
            self.appended: list[dict] = []

        async def append(self, kind, body, session, sync=True):
            self.appended.append(body)
            return len(self.appended)

    journal = [{"type": "run.started", "flow": "waiter", "exec": 5, "input": {}},
               {"type": "message", "channel": "inbox", "msg_seq": 1, "message": "early"},
               {"type": "wait", "seq": 0, "name": "wait", "channel": "inbox", "due": 0.0}]

    async def main() -> tuple[Flows, FakeBus, Log]:
        bus, log = FakeBus(), Log()
        bus.incarnation = 2
        flows = Flows(bus=bus, log=log, query=None, index=0, shards=1, logger=logging.getLogger("t"))

        async def query(name: str, session: str, **params) -> dict:
            if name == "open_runs":
                return {"rows": [{"run_id": "w-1"}]}
            return {"rows": [{"run": "w-1", "tenant": "t", "at": 0.0, **record} for record in journal]}

        flows.query = query
        await flows.load()
        for _ in range(20):
            await asyncio.sleep(0)
        return flows, bus, log

    flows, bus, log = asyncio.run(main())
    run = flows.runs["w-1"]
    assert [(r["type"], r.get("msg_seq")) for r in log.appended] == [("message.taken", 1), ("op.done", None)]
    assert run.ops[0].done and run.ops[0].result == "early" and run.waiting is None
    assert [kind for _, kind, _ in bus.sent][-1] == Kind.TASK_SUBMIT   # executed again, past its wait
