"""End-to-end: a tool named in `kernel.approve_tools` waits for a person before it runs. Its turn
streams a `tool` event of phase `approval`; the session's `active_turn` lists the call; an answer
of no leaves it unrun and the model told why, yes runs it, none within the timeout is a no; the
wait survives its actor's kill -9 and the answer given then is acted on; bad answers are refused."""
import asyncio
import json

import aiohttp

from broker.sharding import actor_name
from harness import finished_transcript, get_json, run_turn, wait_until

TOOLS = "[[mock tool_calls=get_weather,search ttft_ms=20]]"


def answer(base, sid, turn_id, call_id, body):
    return get_json(f"{base}/v1/sessions/{sid}/turns/{turn_id}/approvals/{call_id}", method="POST",
                    body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})


def turn_answered(base, sid, text, decide, then=None):
    """A turn whose approval events are answered by `decide(turn_id, event)` (None: not answered);
    `then(result)` is called at each of its other tool events."""
    async def go():
        async with aiohttp.ClientSession() as http:
            async def on_event(name, result):
                if name == "tool" and result.events[-1][1]["phase"] != "approval" and then is not None:
                    await asyncio.get_running_loop().run_in_executor(None, then, result)
                if name == "tool" and result.events[-1][1]["phase"] == "approval":
                    turn_id = result.data("turn.started")["turn_id"]
                    body = decide(turn_id, result.events[-1][1])
                    if body is not None:
                        await asyncio.get_running_loop().run_in_executor(
                            None, answer, base, sid, turn_id, result.events[-1][1]["call_id"], body)
            return await run_turn(http, base, sid, text, on_event=on_event, timeout=60)
    return asyncio.run(go())


def tool_events(result):
    return [(d["phase"], d["name"]) for e, d in result.events if e == "tool"]


def test_a_tool_waits_for_its_approval_and_a_no_or_no_answer_leaves_it_unrun(make_server, make_worker, tmp_path):
    marker = tmp_path / "tools.txt"
    server = make_server({"kernel": {"approve_tools": "search", "approval_timeout_secs": 4}})
    make_worker(server, env={"FLOWS_APP_TOOL_MARKER": str(marker)})
    base, seen = server.url, {}

    def deny(turn_id, event):
        seen["session"] = get_json(f"{base}/v1/sessions/approve-1")[2]["active_turn"]
        assert answer(base, "approve-1", turn_id, "no-such-call", {"approve": True})[0] == 409
        assert answer(base, "approve-1", turn_id, event["call_id"], {"approve": "yes"})[0] == 400
        return {"approve": False, "reason": "not on my card"}

    denied = turn_answered(base, "approve-1", f"weather and news {TOOLS}", deny)
    assert denied.terminal == "turn.completed", denied.events[-3:]
    events = tool_events(denied)   # the two at once: the weather needs no approval
    assert events[:2] == [("call", "get_weather"), ("call", "search")]
    assert sorted(events[2:]) == [("approval", "search"), ("result", "get_weather"), ("result", "search")]
    assert events.index(("approval", "search")) < events.index(("result", "search"))
    asked = next(d for e, d in denied.events if e == "tool" and d["phase"] == "approval")
    assert seen["session"]["approvals"] == [{"call_id": asked["call_id"], "name": "search",
                                             "arguments": asked["arguments"], "until": asked["until"]}]
    result = [d for e, d in denied.events if e == "tool" and d["phase"] == "result"][-1]
    assert result["ok"] is False and "not on my card" in result["error"]
    assert marker.read_text().split("\n")[0].startswith("weather") and "search" not in marker.read_text()
    transcript = get_json(f"{base}/v1/sessions/approve-1/messages")[2]["messages"]
    assert "not on my card" in transcript[3]["content"] and transcript[-1]["role"] == "assistant"
    turn_id = denied.data("turn.started")["turn_id"]
    assert answer(base, "approve-1", turn_id, asked["call_id"], {"approve": True})[0] == 404   # it has ended
    history = get_json(f"{base}/v1/sessions/approve-1/events?limit=1000")[2]["events"]
    assert [(e["type"], e["data"].get("approve"), e["data"].get("reason")) for e in history
            if e["type"].startswith("tool.approval")] == [("tool.approval", None, None),
                                                          ("tool.approval_answered", False, "not on my card")]

    approved = turn_answered(base, "approve-2", f"weather and news {TOOLS}", lambda *_: {"approve": True})
    assert approved.terminal == "turn.completed"
    assert [d["ok"] for e, d in approved.events if e == "tool" and d["phase"] == "result"] == [True, True]
    assert marker.read_text().count("search weather and news") == 1

    unanswered = turn_answered(base, "approve-3", f"weather and news {TOOLS}", lambda *_: None)
    assert unanswered.terminal == "turn.completed"
    result = [d for e, d in unanswered.events if e == "tool" and d["phase"] == "result"][-1]
    assert result["ok"] is False and "nobody approved it in time" in result["error"]
    history = get_json(f"{base}/v1/sessions/approve-3/events?limit=1000")[2]["events"]
    assert [e["data"]["approve"] for e in history if e["type"] == "tool.approval_answered"] == [False]
    assert marker.read_text().count("search weather and news") == 1


def test_a_wait_for_approval_survives_its_actors_kill(make_server, make_worker, tmp_path):
    marker = tmp_path / "tools.txt"
    server = make_server({"kernel": {"approve_tools": "*", "approval_timeout_secs": 60}})
    make_worker(server, env={"FLOWS_APP_TOOL_MARKER": str(marker)})
    base, sid = server.url, "approve-kill"

    def approve_one(turn_id, event):
        return {"approve": True} if event["name"] == "get_weather" else None

    def kill_once_the_weather_ran(result):
        last = result.events[-1][1]
        if last["phase"] == "result" and last["name"] == "get_weather":   # the search waits: its actor dies
            server.kill9(actor_name(sid, 2))

    cut = turn_answered(base, sid, f"weather and news {TOOLS}", approve_one, then=kill_once_the_weather_ran)
    assert cut.terminal is None

    def waiting():
        active = get_json(f"{base}/v1/sessions/{sid}")[2].get("active_turn")
        return active if active and active["approvals"] else None

    active = wait_until(waiting, 30, "the resumed turn to wait for its approval again", interval=0.2)
    assert active["resumed"] is True and [a["name"] for a in active["approvals"]] == ["search"]
    status, _, body = answer(base, sid, active["turn_id"], active["approvals"][0]["call_id"], {"approve": True})
    assert status == 200 and body["approved"] is True

    messages = finished_transcript(base, sid)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "assistant"]
    effects = marker.read_text().splitlines()
    assert effects.count("weather weather and news") == 1 and effects.count("search weather and news") == 1
