"""End-to-end: the agent loop on durable steps — tool calls run by a worker, journaled, and a
turn that finishes after its actor was killed mid-turn."""
import asyncio
import json
import os
import signal
import time

import aiohttp

from agentos.config import BrokerConfig
from harness import finished_transcript, get_json, run_turn, turn, turn_killing_its_actor, wait_until

TOOLS = "[[mock tool_calls=get_weather,search ttft_ms=20]]"


def test_a_turn_with_two_tool_calls_runs_them_at_once_and_records_both_steps(make_server, make_worker, tmp_path):
    marker = tmp_path / "tools.txt"
    server = make_server()
    # the weather tool returns only once a search has started beside it (else it fails)
    make_worker(server, env={"FLOWS_APP_TOOL_MARKER": str(marker), "FLOWS_APP_WEATHER_BESIDE": str(tmp_path / "b")})
    result = turn(server.url, "agent-tools", f"what is the weather in Paris {TOOLS}")
    assert result.terminal == "turn.completed", result.events[-1]
    tools = [(d["phase"], d["name"]) for e, d in result.events if e == "tool"]
    assert tools[:2] == [("call", "get_weather"), ("call", "search")]
    assert sorted(tools[2:]) == [("result", "get_weather"), ("result", "search")]
    weather = next(d for e, d in result.events if e == "tool" and d["phase"] == "result" and d["name"] == "get_weather")
    assert weather["ok"] is True and weather["result"]["forecast"] == "sunny", weather
    done = result.data("turn.completed")
    assert done["steps"] == 4 and done["finish_reason"] == "stop"          # model, tool, tool, model
    assert result.text  # the model's final answer streamed after the tools
    assert sorted(marker.read_text().splitlines()) == ["search done what is the weather in Paris",
                                                       "search what is the weather in Paris",
                                                       "weather what is the weather in Paris"]
    _, _, transcript = get_json(f"{server.url}/v1/sessions/agent-tools/messages")
    roles = [m["role"] for m in transcript["messages"]]
    assert roles == ["user", "assistant", "tool", "tool", "assistant"]
    calls = transcript["messages"][1]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "search"]
    assert [m["tool_call_id"] for m in transcript["messages"][2:4]] == [c["id"] for c in calls]   # in the calls' order
    assert json.loads(transcript["messages"][2]["content"])["forecast"] == "sunny"
    _, _, events = get_json(f"{server.url}/v1/sessions/agent-tools/events")
    assert [e["data"]["kind"] for e in events["events"] if e["type"] == "step.completed"] == ["model", "model"]


def test_tool_calls_at_once_1_runs_an_answers_calls_one_after_another(make_server, make_worker, tmp_path):
    marker = tmp_path / "tools.txt"
    server = make_server({"kernel": {"tool_calls_at_once": 1}})
    make_worker(server, env={"FLOWS_APP_TOOL_MARKER": str(marker), "FLOWS_APP_WEATHER_SECS": "0.5"})
    result = turn(server.url, "agent-tools-serial", f"weather {TOOLS}")
    assert result.terminal == "turn.completed", result.events[-1]
    tools = [(d["phase"], d["name"], d.get("ok")) for e, d in result.events if e == "tool"]
    assert tools[2:] == [("result", "get_weather", True), ("result", "search", True)], tools
    # the search began once the weather's half second was over (at once, it begins within it)
    assert marker.read_text().splitlines() == ["weather weather", "weather done weather", "search weather",
                                               "search done weather"]


def test_a_turn_survives_kill9_of_its_actor_mid_turn(make_server, make_worker, tmp_path):
    marker = tmp_path / "tools.txt"
    server = make_server({"gateway": {"turn_probe_secs": 1}})
    gate = tmp_path / "gate"
    make_worker(server, env={"FLOWS_APP_TOOL_MARKER": str(marker), "FLOWS_APP_TOOL_DELAY": "2",
                             "FLOWS_APP_TOOL_GATE": str(gate)})
    sid = "agent-kill"

    told = "Answer as a weather forecaster would. " * 10   # the turn's own instructions: kept for its resume
    result = turn_killing_its_actor(server, sid, "weather and news", gate, system=told)
    assert result.terminal is None and result.events[-1][0] == "turn.interrupted", result.events[-3:]
    assert result.events[-1][1]["code"] == "resumed_in_background"

    messages = finished_transcript(server.url, sid)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "assistant"]
    effects = marker.read_text().splitlines()
    assert effects.count("weather weather and news") == 1     # committed before the kill: never again
    assert 1 <= effects.count("search weather and news") <= 2  # in flight at the kill: run again
    events = get_json(f"{server.url}/v1/sessions/{sid}/events?limit=1000")[2]["events"]
    models = [e["data"] for e in events if e["type"] == "step.completed" and e["data"]["kind"] == "model"]
    assert models and models[-1]["prompt_tokens"] >= len(told) // 4   # the resumed call was told them too
    again = turn(server.url, sid, "and now?")
    assert again.terminal == "turn.completed"


def test_cancelling_a_turn_stops_its_running_tool(make_server, make_worker, tmp_path):
    marker = tmp_path / "tools.txt"
    server = make_server()
    make_worker(server, env={"FLOWS_APP_TOOL_MARKER": str(marker), "FLOWS_APP_TOOL_DELAY": "3"})
    sid = "agent-cancel"

    async def go():
        async def on_event(name, result):
            if name == "tool" and result.events[-1][1] == {**result.events[-1][1], "phase": "call", "name": "search"}:
                await asyncio.get_running_loop().run_in_executor(None, lambda: wait_until(
                    lambda: marker.exists() and "search cancel me" in marker.read_text(), 10, "the tool to start"))
                async with aiohttp.ClientSession() as other:
                    async with other.delete(f"{server.url}/v1/sessions/{sid}/turns/current") as resp:
                        assert resp.status == 200

        async with aiohttp.ClientSession() as s:
            return await run_turn(s, server.url, sid, f"cancel me {TOOLS}", on_event=on_event, timeout=30)

    result = asyncio.run(go())
    assert result.terminal == "turn.cancelled"
    time.sleep(3.5)  # past the tool's own 3 s: had it not been stopped, it would have finished by now
    assert "search done cancel me" not in marker.read_text()
    # The cut call is answered in the history, so the next turn's model call is one a provider
    # takes (OpenAI's API, and the mock, refuse a tool call left without its answer).
    again = turn(server.url, sid, "and now?")
    assert again.terminal == "turn.completed", again.events[-1]
    messages = get_json(f"{server.url}/v1/sessions/{sid}/messages")[2]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "user", "assistant"]
    calls = {c["id"]: c["function"]["name"] for c in messages[1]["tool_calls"]}
    answers = {calls[m["tool_call_id"]]: json.loads(m["content"]) for m in messages[2:4]}
    assert "cancelled" in answers["search"]["error"], answers
    # the weather ran beside it: done before the cancel, or (on a starved machine) cut too
    assert answers["get_weather"].get("forecast") == "sunny" or "cancelled" in answers["get_weather"]["error"]


def test_a_turn_superseded_while_its_tools_run_leaves_a_history_the_next_turns_can_use(make_server, make_worker,
                                                                                       tmp_path):
    """The new turn starts once the old one has answered its cut calls: before, it sent the
    model a history with those calls unanswered (a provider's 400), and the old turn's answers
    came after its question, which broke every later turn of the session too."""
    marker = tmp_path / "tools.txt"
    server = make_server()
    make_worker(server, env={"FLOWS_APP_TOOL_MARKER": str(marker), "FLOWS_APP_TOOL_DELAY": "3"})
    sid = "agent-superseded"

    async def go():
        async with aiohttp.ClientSession() as s:
            first = asyncio.ensure_future(run_turn(s, server.url, sid, f"first {TOOLS}", timeout=30))
            await asyncio.get_running_loop().run_in_executor(None, lambda: wait_until(
                lambda: marker.exists() and "search first" in marker.read_text(), 10, "the tool to start"))
            second = await run_turn(s, server.url, sid, "second", timeout=30)
            return await first, second

    first, second = asyncio.run(go())
    assert first.terminal == "turn.cancelled" and second.terminal == "turn.completed", second.events[-1]
    third = turn(server.url, sid, "third")
    assert third.terminal == "turn.completed", third.events[-1]
    messages = get_json(f"{server.url}/v1/sessions/{sid}/messages")[2]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "user", "assistant", "user",
                                             "assistant"], messages
    assert "cancelled (superseded)" in json.loads(messages[3]["content"])["error"]


def test_a_cancel_a_stalled_worker_missed_still_stops_its_tool(make_server, make_worker, tmp_path):
    """The broker bounces what is sent to a peer silent past `broker.peer_timeout_secs`: the turn's
    cancel, sent to a worker stalled that long, was lost, and its tool (one that does not return)
    kept the worker's slot for good. The actor cancels a task the worker still reports again."""
    marker = tmp_path / "tools.txt"
    server = make_server()
    worker = make_worker(server, env={"FLOWS_APP_TOOL_MARKER": str(marker), "FLOWS_APP_TOOL_DELAY": "600"})
    sid = "agent-stalled-cancel"
    stopped = []

    async def go():
        async def on_event(name, result):
            if name == "tool" and result.events[-1][1] == {**result.events[-1][1], "phase": "call", "name": "search"}:
                await asyncio.get_running_loop().run_in_executor(None, lambda: wait_until(
                    lambda: marker.exists() and "search stall me" in marker.read_text(), 10, "the tool to start"))
                os.kill(worker.pid, signal.SIGSTOP)
                stopped.append(worker.pid)
                await asyncio.sleep(BrokerConfig().peer_timeout_secs + 0.5)
                async with aiohttp.ClientSession() as other:
                    async with other.delete(f"{server.url}/v1/sessions/{sid}/turns/current") as resp:
                        assert resp.status == 200

        async with aiohttp.ClientSession() as s:
            return await run_turn(s, server.url, sid, f"stall me {TOOLS}", on_event=on_event, timeout=30)

    try:
        result = asyncio.run(go())
        assert result.terminal == "turn.cancelled"
        time.sleep(0.5)          # the cancels bounced meanwhile
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    wait_until(lambda: "search cancelled stall me" in marker.read_text(), 20, "the tool to be cancelled")


def test_a_tool_call_that_cannot_be_answered_is_an_error_the_model_reads_at_once(make_server, make_worker):
    """A tool returning bytes failed the whole turn with an internal error; a tool no worker has
    (the model made it up) waited in the scheduler's queue for the tool timeout, two minutes."""
    server = make_server()
    make_worker(server)
    for sid, marker, error in (
            ("agent-raw", "tool_calls=read_raw", "the result of tool 'read_raw' must be JSON-serialisable"),
            ("agent-made-up", "made_up_tool_calls=no_such_tool", "no worker has a tool named 'no_such_tool'")):
        result = turn(server.url, sid, f"go [[mock {marker} ttft_ms=20]]")
        assert result.terminal == "turn.completed", result.events[-1]
        answer = next(d for e, d in result.events if e == "tool" and d["phase"] == "result")
        assert answer["ok"] is False and error in answer["error"], answer
