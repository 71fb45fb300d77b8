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
