"""Tool approvals (actors/tool_approvals.py) with fakes for the bus and the log: the wait is
journaled before its event goes out and the answer before it is acted on; no answer in time is a
no; a replayed turn follows its journal; an answer the disk refused leaves the call waiting."""
import asyncio
import time

from actors.flow_state import Run, apply
from actors.provider import ToolCall
from actors.tool_approvals import ToolApprovals
from actors.turn import Turn
from broker.protocol import Kind
from storage.log_client import LogWriteError
from test_flow_results_due import running_flows

CALL = ToolCall("call-1", "search", '{"q": "x"}')


def turn_and_run(bus):
    turn = Turn(bus, "t1", "s1", "acme", "go", "gateway/0#1")
    run = Run("s1/t1", "turn", "acme")
    apply(run, {"run": "s1/t1", "tenant": "acme", "type": "run.started", "at": time.time(), "exec": 0,
                "flow": "turn", "input": {}})
    return turn, run


def test_which_tools_need_approval():
    flows = object()
    assert [ToolApprovals(flows, names, 1.0).needed("search") for names in ("search", " a , search ", "*", "", "a")] \
        == [True, True, True, False, False]


def test_a_call_waits_journaled_until_its_answer_is_journaled_then_goes_as_answered():
    async def main():
        flows, bus, log, _ = running_flows()
        approvals = ToolApprovals(flows, "search", 60.0)
        turn, run = turn_and_run(bus)
        asking = asyncio.ensure_future(approvals.ask(turn, run, 3, CALL))
        await asyncio.sleep(0.05)
        assert not asking.done()
        wait = log.appended[-1]
        assert wait["type"] == "wait" and wait["seq"] == 3 and wait["channel"] == "approval:call-1"
        assert time.time() + 55 < wait["due"] < time.time() + 61
        event = [b for _, k, b in bus.sent if k == Kind.TURN_TOOL][-1]
        assert event["phase"] == "approval" and event["data"]["call_id"] == "call-1"
        assert turn.approvals["call-1"].view["until"] == wait["due"]
        assert await approvals.answer(turn, run, "call-9", True, "") == "not_waiting"
        assert await approvals.answer(turn, run, "call-1", False, "not now") is None
        assert log.appended[-1]["type"] == "op.done" and log.appended[-1]["result"] == {"approve": False,
                                                                                          "reason": "not now"}
        assert await asyncio.wait_for(asking, 2) == (False, "not now") and turn.approvals == {}
        assert await approvals.answer(turn, run, "call-1", True, "") == "not_waiting"   # asked once

        # replayed after a restart: the answer recorded is not asked again
        assert await approvals.ask(turn, run, 3, CALL) == (False, "not now")

    asyncio.run(main())


def test_no_answer_in_time_is_a_no_and_a_refused_answer_leaves_the_call_waiting():
    async def main():
        flows, bus, log, _ = running_flows()
        approvals = ToolApprovals(flows, "*", 0.3)
        turn, run = turn_and_run(bus)
        assert await asyncio.wait_for(approvals.ask(turn, run, 0, CALL), 2) == (False, "nobody approved it in time")
        assert log.appended[-1]["type"] == "op.done" and log.appended[-1]["ok"] is False

        approvals.timeout_secs = 60.0
        asking = asyncio.ensure_future(approvals.ask(turn, run, 1, ToolCall("call-2", "search", "{}")))
        await asyncio.sleep(0.05)
        appended = log.append

        async def refuse(kind, body, session, sync=True):
            raise LogWriteError("disk_full", "no space left on device")
        log.append = refuse
        assert await approvals.answer(turn, run, "call-2", True, "") == "disk_full"
        assert not run.ops[1].done and not asking.done() and "call-2" in turn.approvals
        log.append = appended
        assert await approvals.answer(turn, run, "call-2", True, "") is None
        assert await asyncio.wait_for(asking, 2) == (True, "")

    asyncio.run(main())
