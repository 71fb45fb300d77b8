"""One model answer's tool calls (actors/agent_loop.py `_tool_round`), with fakes for the bus,
the log and the workers: the calls run at once, each at a place fixed with the answer; a
journal of code before those places replays one by one where it was; a round cut short answers
each call it did not finish, so the history stays one a provider takes."""
import asyncio
import time

from actors.agent_loop import AgentLoop
from actors.flow_state import Run, apply
from actors.provider import ToolCall
from actors.session import Session
from actors.tool_approvals import ToolApprovals
from actors.turn import Turn
from test_flow_results_due import running_flows

WEATHER, SEARCH, NEWS = (ToolCall("call-1", "get_weather", "{}"), ToolCall("call-2", "search", "{}"),
                         ToolCall("call-3", "news", "{}"))


def setting(approve: str = ""):
    flows, bus, log, _ = running_flows()
    loop = AgentLoop(None, None, None, flows, bus, 0, 8, ToolApprovals(flows, approve, 60.0), tool_calls_at_once=8)
    turn = Turn(bus, "t1", "s1", "acme", "go", "gateway/0#1")
    run = Run("s1/t1", "turn", "acme")
    apply(run, {"run": "s1/t1", "tenant": "acme", "type": "run.started", "at": time.time(), "exec": 0,
                "flow": "turn", "input": {}})
    return loop, turn, run, Session("s1", "acme"), log


def record(run: Run, **fields) -> None:
    apply(run, {"run": run.run_id, "tenant": "acme", "at": time.time(), "exec": 0, **fields})


def test_an_answers_calls_run_at_once_at_the_places_fixed_with_it():
    async def main():
        loop, turn, run, session, log = setting(approve="search")
        assert loop._places(1, [WEATHER, SEARCH, NEWS]) == [[-1, 1], [2, 3], [-1, 4]]   # search waits at 2
        started: list[str] = []
        both = asyncio.Event()

        async def run_tool(turn, run, call):
            started.append(call.name)
            if len(started) == 2:
                both.set()
            await asyncio.wait_for(both.wait(), 2)   # returns only once the other has started too
            return True, call.name

        loop._run_tool = run_tool
        assert await loop._tool_round(turn, session, run, 1, [WEATHER, NEWS], [[-1, 1], [-1, 2]]) == 3
        assert sorted(started) == ["get_weather", "news"]
        assert [(m["tool_call_id"], m["content"]) for m in session.messages] == [("call-1", '"get_weather"'),
                                                                                ("call-3", '"news"')]
        assert {(b["seq"], b["name"]) for b in log.appended if b["type"] == "step.done"} == {
            (1, "tool:get_weather"), (2, "tool:news")}

    asyncio.run(main())


def test_a_journal_without_places_replays_its_calls_one_by_one_where_they_were():
    async def main():
        loop, turn, run, session, _ = setting(approve="")   # the policy changed since: nothing asks now
        # code before places: the weather waited at 1 and was denied (no step), the search ran at 2
        record(run, type="wait", seq=1, name="approval:get_weather", channel="approval:call-1", due=time.time() + 60)
        record(run, type="op.done", seq=1, op="wait", ok=True, result={"approve": False, "reason": "no"})
        record(run, type="step.done", seq=2, name="tool:search", ok=True, result={"hits": 3}, attempt=1)

        async def run_tool(turn, run, call):
            raise AssertionError(f"{call.name} ran again")

        loop._run_tool = run_tool
        assert await loop._tool_round(turn, session, run, 1, [WEATHER, SEARCH], None) == 3
        assert "did not approve" in session.messages[0]["content"] and session.messages[1]["content"] == '{"hits":3}'

    asyncio.run(main())


def test_a_round_cut_short_answers_the_calls_it_did_not_finish():
    async def main():
        loop, turn, run, session, _ = setting()

        async def run_tool(turn, run, call):
            if call.name == "search":
                await asyncio.sleep(60)
            return True, {"ok": call.name}

        loop._run_tool = run_tool
        turn.cancel_reason = "superseded"
        round_ = asyncio.ensure_future(loop._tool_round(turn, session, run, 1, [WEATHER, SEARCH], [[-1, 1], [-1, 2]]))
        for _ in range(200):   # the weather's step is done, the search's runs
            if run.ops.get(1) is not None and run.ops[1].done:
                break
            await asyncio.sleep(0.01)
        round_.cancel()
        try:
            await round_
        except asyncio.CancelledError:
            pass
        assert [m["tool_call_id"] for m in session.messages] == ["call-1", "call-2"]
        assert session.messages[0]["content"] == '{"ok":"get_weather"}'
        assert "not finished: the turn was cancelled (superseded)" in session.messages[1]["content"]

    asyncio.run(main())
