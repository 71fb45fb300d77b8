"""A run takes one message per key, and `ctx.send` sends under its run's and place's key (actors/
run_messages.py), with fakes for the bus and the log (end to end: test_e2e_flow_concurrency.py)."""
import asyncio
import time

import pytest

from actors import run_messages
from actors.flow_context import FlowContext
from actors.flow_state import apply
from actors.flow_types import SendFailed
from broker.client import BusError
from broker.protocol import Kind, Message
from storage.log_client import LogWriteError
from test_flow_patches import Runtime
from test_flow_recovery import AcceptingLog, restarted
from test_flow_results_due import from_worker, running_flows
from test_run_links import FakeBus


def publish(message, key=None, run_id="r-1") -> Message:
    return Message("gateway/0", Kind.CHANNEL_PUBLISH, 1, 0.0, 0, run_id, "",
                   {"run_id": run_id, "tenant": "t", "channel": "inbox", "message": message,
                    **({"key": key} if key else {})})


def acks(bus) -> list[dict]:
    return [body for _, kind, body in bus.sent if kind == Kind.FLOW_ACK]


def test_a_publish_again_under_its_key_is_answered_as_the_first_and_taken_once():
    async def main():
        flows, bus, log, run = running_flows()
        for message, key in (("first", "k1"), ("first", "k1"), ("second", "k2"), ("plain", None)):
            await flows.on_publish(publish(message, key))
        apply(run, {"run": "r-1", "type": "run.ended", "status": "completed", "exec": 7})
        await flows.on_publish(publish("first", "k1"))    # its answer was lost; the run has ended since
        await flows.on_publish(publish("third", "k3"))
        return bus, log, run

    bus, log, run = asyncio.run(main())
    assert [m for _, m in run.channels["inbox"]] == ["first", "second", "plain"]
    assert [(r["message"], r.get("key")) for r in log.appended if r["type"] == "message"] == [
        ("first", "k1"), ("second", "k2"), ("plain", None)]
    assert [a["ok"] for a in acks(bus)] == [True] * 5 + [False] and acks(bus)[-1]["code"] == "ended"


def test_a_run_read_back_from_its_journal_still_knows_the_keys_it_took():
    journal = [{"type": "run.started", "flow": "steps", "exec": 5, "input": {}},
               {"type": "wait", "seq": 0, "name": "other", "channel": "other", "due": 0.0},
               {"type": "message", "channel": "inbox", "msg_seq": 1, "message": "first", "key": "k1"}]

    async def main():
        bus, log = FakeBus(), AcceptingLog()
        flows = await restarted(bus, log, "r-1", journal)
        await flows.on_publish(publish("first", "k1"))
        return flows, bus, log

    flows, bus, log = asyncio.run(main())
    assert log.appended == [] and acks(bus) == [{"ok": True}]
    assert [m for _, m in flows.runs["r-1"].channels["inbox"]] == ["first"]


class SlowThenRefusing(AcceptingLog):
    """A full disk that answers late: the retry comes while the first's record is written."""

    async def append(self, kind, body, session, sync=True):
        refuse = self.refuse   # (as the disk was when the record went)
        await asyncio.sleep(0.05)
        if refuse:
            raise LogWriteError("disk_full", "log write failed: No space left on device")
        self.appended.append(body)


@pytest.mark.parametrize("refuse", [False, True])
def test_a_retry_while_the_first_is_written_hears_how_that_went(refuse):
    async def main():
        flows, bus, _, run = running_flows()
        flows.journal_log = log = SlowThenRefusing()
        log.refuse = refuse
        first = asyncio.ensure_future(flows.on_publish(publish("first", "k1")))
        await asyncio.sleep(0.01)
        log.refuse = False   # (the disk has room again when the retry's own record goes)
        await flows.on_publish(publish("first", "k1"))
        await first
        return bus, log, run

    bus, log, run = asyncio.run(main())
    assert [m for _, m in run.channels["inbox"]] == ["first"]
    assert [r["message"] for r in log.appended if r["type"] == "message"] == ["first"]
    # refused, the first is answered so, and the retry goes on as the first and is taken
    assert sorted(a["ok"] for a in acks(bus)) == ([False, True] if refuse else [True, True])


def step_start_send(seq: int, target: str = "r-2") -> Message:
    return from_worker(Kind.STEP_START, seq + 1, seq=seq, op="send", name=f"inbox@{target}", target=target,
                       channel="inbox", message={"n": seq})


def test_a_send_goes_under_its_run_and_place_and_its_outcome_is_journaled(monkeypatch):
    monkeypatch.setattr(run_messages, "SEND_ATTEMPTS", 2)
    answers = iter([BusError("timeout", "no answer"), {"ok": True}, {"ok": False, "code": "not_found",
                                                                         "error": "no such run"}])
    asked = []

    async def main():
        flows, bus, log, run = running_flows()

        async def request(dest, kind, body, **_):
            asked.append((dest, kind, body))
            answer = next(answers)
            if isinstance(answer, Exception):
                raise answer
            return Message(dest, Kind.FLOW_ACK, 1, time.time(), 0, "", "", answer)

        bus.request = request
        await flows.on_step_start(step_start_send(0))
        await flows.on_step_start(step_start_send(1, "gone"))
        return bus, log, run

    bus, log, run = asyncio.run(main())
    assert [(kind, body["run_id"], body["key"], body["message"]) for _, kind, body in asked] == [
        (Kind.CHANNEL_PUBLISH, "t~r-2", "r-1@0", {"n": 0}), (Kind.CHANNEL_PUBLISH, "t~r-2", "r-1@0", {"n": 0}),
        (Kind.CHANNEL_PUBLISH, "t~gone", "r-1@1", {"n": 1})]   # (in the run's tenant, t)
    gos = [body for _, kind, body in bus.sent if kind == Kind.STEP_GO]
    assert gos[0] == {"action": "continue", "ok": True, "result": {"run_id": "r-2", "channel": "inbox"}}
    assert gos[1]["action"] == "continue" and not gos[1]["ok"] and "not_found" in gos[1]["error"]
    assert [(r["op"], r["seq"], r["ok"]) for r in log.appended if r["type"] == "op.done"] == [
        ("send", 0, True), ("send", 1, False)]


def test_a_send_whose_target_cannot_be_reached_journals_nothing_and_ends_the_execution(monkeypatch):
    monkeypatch.setattr(run_messages, "SEND_ATTEMPTS", 2)

    async def main():
        flows, bus, log, run = running_flows()
        run.tenant = "acme"   # (a tenant's run sends to its own tenant's ids)

        async def request(dest, kind, body, **_):
            bus.requests = getattr(bus, "requests", []) + [body]
            raise BusError("timeout", "no answer")

        bus.request = request
        await flows.on_step_start(step_start_send(0))
        return bus, log, run

    bus, log, run = asyncio.run(main())
    assert [b["run_id"] for b in bus.requests] == ["acme~r-2", "acme~r-2"]
    assert bus.sent[-1][1:] == (Kind.STEP_GO, {"action": "abort"}) and log.appended == [] and 0 not in run.ops


def test_the_sdk_checks_a_send_and_a_replayed_failure_raises_it_again():
    recorded = [{"seq": 0, "op": "send", "name": "inbox@r-2", "ok": True, "result": {"run_id": "r-2"}},
                {"seq": 1, "op": "send", "name": "inbox@gone", "ok": False, "error": "not_found: no such run"}]

    async def flow(ctx):
        await ctx.send("r-2", "inbox", 1)
        await ctx.send("gone", "inbox", 2)

    runtime = Runtime({})
    with pytest.raises(SendFailed, match="not_found"):
        asyncio.run(flow(FlowContext(runtime, "r-1", 1, None, recorded, {})))
    assert runtime.started == []   # both replayed, nothing asked
    for bad in ((None, "inbox"), ("r-2", ""), ("", "inbox")):
        with pytest.raises(ValueError):
            asyncio.run(FlowContext(Runtime({}), "r-1", 1, None, [], {}).send(*bad))
    with pytest.raises(TypeError):
        asyncio.run(FlowContext(Runtime({}), "r-1", 1, None, [], {}).send("r-2", "inbox", object()))


def test_a_send_that_returns_to_a_run_cancelled_meanwhile_records_nothing():
    async def main():
        flows, bus, log, run = running_flows()

        async def request(dest, kind, body, **_):
            apply(run, {"run": "r-1", "type": "run.ended", "status": "cancelled", "exec": 7})   # cancelled meanwhile
            return Message(dest, Kind.FLOW_ACK, 1, time.time(), 0, "", "", {"ok": True})

        bus.request = request
        await flows.on_step_start(step_start_send(0))
        return bus, log

    bus, log = asyncio.run(main())
    assert bus.sent[-1][1:] == (Kind.STEP_GO, {"action": "abort"}) and log.appended == []
