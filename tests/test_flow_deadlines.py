"""Writes to a run (start, publish, update, cancel) that reach its actor after their caller gave
up are not done: the caller answered 503, and a client then sends them again (unit, with the fakes
of test_flow_results_due.py)."""
import asyncio
import time

from broker.protocol import Kind, Message
from test_flow_results_due import Bus, running_flows


def test_a_write_that_comes_after_its_caller_gave_up_is_not_done_and_one_in_time_is():
    """A publish (a start, an update, a cancel) that waited at a stalled actor past its caller's
    timeout: the caller answered 503, and a client sends it again — done twice, had the first been
    done when the actor came back."""
    from actors.flow_client import FlowClient
    from broker.protocol import DEADLINE_MARGIN_SECS

    class AskingBus(Bus):
        async def request(self, dest, kind, body, **_):
            self.sent.append((dest, kind, body))
            return Message(dest, Kind.FLOW_ACK, 1, time.time(), 0, "", "", {"ok": True, "values": {}})

    async def main():
        asking = AskingBus()
        client = FlowClient(asking, 2, timeout=30.0)
        await client.publish("r-1", "inbox", "hi")
        await client.attributes("r-1")
        (_, _, publish), (_, _, read) = asking.sent
        assert 29.0 < publish["deadline"] - time.time() <= 30.0 and "deadline" not in read

        flows, bus, log, run = running_flows()
        publish = flows.handlers()[Kind.CHANNEL_PUBLISH]
        body = {"run_id": "r-1", "tenant": "t", "channel": "inbox"}
        late = time.time() + DEADLINE_MARGIN_SECS - 0.5        # its caller gives up in half a second
        await publish(Message("gateway/0#1", Kind.CHANNEL_PUBLISH, 1, time.time(), 0, "r-1", "",
                              {**body, "message": "late", "deadline": late}))
        await publish(Message("gateway/0#1", Kind.CHANNEL_PUBLISH, 2, time.time(), 0, "r-1", "",
                              {**body, "message": "in time", "deadline": time.time() + 30.0}))
        assert [m for _, m in run.channels["inbox"]] == ["in time"]
        assert [b["message"] for b in log.appended if b["type"] == "message"] == ["in time"]
        assert bus.sent == [("gateway/0#1", Kind.FLOW_ACK, {"ok": True})]

    asyncio.run(main())


def test_a_write_whose_caller_gave_up_while_its_run_was_read_back_is_not_done():
    """A write that came in time but waited on writer/store's read of its run's journal (slow,
    or a stall) past its caller's deadline: checked again once the run is found, before anything
    is committed. A start without an Idempotency-Key made a second run on the client's retry."""
    from broker.protocol import DEADLINE_MARGIN_SECS

    started = {"run": "r-2", "tenant": "t", "at": time.time(), "type": "run.started", "flow": "steps", "exec": 1,
               "input": {}}

    async def main():
        flows, bus, log, _ = running_flows()
        bus.incarnation = 1
        journals = {"r-2": [started]}

        async def slow_read(what, run_id, sync=False):   # writer/store, answering late
            await asyncio.sleep(0.4)
            return {"rows": list(journals.get(run_id, []))}

        flows.query = slow_read
        handlers = flows.handlers()
        def head() -> dict:   # in time on arrival, not once its run is read back
            return {"tenant": "t", "deadline": time.time() + DEADLINE_MARGIN_SECS + 0.2}

        await handlers[Kind.FLOW_START](Message("gateway/0#1", Kind.FLOW_START, 1, time.time(), 0, "r-3", "",
                                                {**head(), "run_id": "r-3", "flow": "steps", "input": {}}))
        await handlers[Kind.CHANNEL_PUBLISH](Message("gateway/0#1", Kind.CHANNEL_PUBLISH, 2, time.time(), 0, "r-2",
                                                     "", {**head(), "run_id": "r-2", "channel": "inbox",
                                                          "message": "late"}))
        flows.runs.pop("r-2")
        await handlers[Kind.FLOW_CANCEL](Message("gateway/0#1", Kind.FLOW_CANCEL, 3, time.time(), 0, "r-2", "",
                                                 {**head(), "run_id": "r-2"}))
        assert "r-3" not in flows.runs and log.appended == [] and bus.sent == []
        assert flows.runs["r-2"].status != "cancelled" and not flows.runs["r-2"].channels.get("inbox")

        # the same writes, with time to spare, are done
        spare = {"tenant": "t", "deadline": time.time() + 30.0}
        await handlers[Kind.FLOW_START](Message("gateway/0#1", Kind.FLOW_START, 4, time.time(), 0, "r-3", "",
                                                {**spare, "run_id": "r-3", "flow": "steps", "input": {}}))
        flows.runs.pop("r-2")
        await handlers[Kind.FLOW_CANCEL](Message("gateway/0#1", Kind.FLOW_CANCEL, 5, time.time(), 0, "r-2", "",
                                                 {**spare, "run_id": "r-2"}))
        assert [b["type"] for b in log.appended] == ["run.started", "run.ended"]
        assert [b["status"] for _, k, b in bus.sent if k == Kind.FLOW_RUN] == ["running", "cancelled"]

    asyncio.run(main())
